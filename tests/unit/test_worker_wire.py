"""The Worker's hand-encoded messages (cronoq/client/_worker.py): a completion and a heartbeat
must be byte for byte what protobuf writes for the same message, since servers and proxies
may compare or log them as protobuf does, and the decoded message must be the one meant."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from cronoq.client._worker import _complete_message, _heartbeat_message, _varint, _wire
from cronoq.proto.cronoq.v1 import cronoq_pb2 as pb

# around each varint length boundary (7 bits a byte), and the uint64 extremes
EDGES = sorted(
    {0, 1, *(v for k in range(1, 10) for v in (2 ** (7 * k) - 1, 2 ** (7 * k))), 2**64 - 1}
)
LEASES = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1))
CONTENT_TYPES = st.one_of(
    st.sampled_from(["", "application/json", "text/plain; charset=utf-8"]), st.text(max_size=300)
)


def test_varints_of_every_length_match_protobuf() -> None:
    assert _varint(0) == b"\x00"
    for n in EDGES[1:]:
        assert b"\x08" + _varint(n) == pb.Nack(lease=n).SerializeToString()
        assert pb.Nack.FromString(b"\x08" + _varint(n)).lease == n


@given(LEASES, st.binary(max_size=40_000), CONTENT_TYPES)
def test_a_completion_is_what_protobuf_writes(lease: int, output: bytes, content_type: str) -> None:
    expected = pb.WorkerMessage(
        complete=pb.Complete(lease=lease, output=output, content_type=content_type)
    ).SerializeToString()
    assert _complete_message(lease, output, content_type) == expected


def test_an_empty_completion_still_names_its_case() -> None:
    data = _complete_message(0, b"", "")
    assert data == pb.WorkerMessage(complete=pb.Complete()).SerializeToString() == b"\x1a\x00"
    assert pb.WorkerMessage.FromString(data).WhichOneof("msg") == "complete"


@given(LEASES)
def test_a_heartbeat_is_what_protobuf_writes(lease: int) -> None:
    expected = pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=lease)).SerializeToString()
    assert _heartbeat_message(lease) == expected


def test_messages_and_their_bytes_go_out_alike() -> None:
    msg = pb.WorkerMessage(nack=pb.Nack(lease=7, reason="worker is stopping"))
    assert _wire(msg) == msg.SerializeToString()
    data = _heartbeat_message(7)
    assert _wire(data) is data
