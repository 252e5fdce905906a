"""The cronoq.v1 proto and its generated stubs: fresh, importable, and true to
docs/reference/proto.md.

The wire facts below are restated from docs/reference/proto.md, not read from the proto, so a
change to the proto that breaks the published contract fails here.
"""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2

import cronoq.proto
from cronoq.proto.cronoq.v1 import cronoq_pb2, cronoq_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
FileProto = descriptor_pb2.FileDescriptorProto
MessageProto = descriptor_pb2.DescriptorProto
FieldProto = descriptor_pb2.FieldDescriptorProto


def _gen_proto() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def file_proto() -> FileProto:
    proto = FileProto()
    cronoq_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


def _message(proto: FileProto, name: str) -> MessageProto:
    (message,) = [m for m in proto.message_type if m.name == name]
    return message


def _fields(message: MessageProto) -> dict[str, FieldProto]:
    return {f.name: f for f in message.field}


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    gen = _gen_proto()
    written = gen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(gen.STUBS)
    stale = [p.name for p in written if p.read_bytes() != (gen.STUBS_DIR / p.name).read_bytes()]
    assert not stale, f"stale stubs {stale}: run .venv/bin/python scripts/gen_proto.py"


def test_proto_text_is_the_packaged_file() -> None:
    text = cronoq.proto.proto_text()
    path = ROOT / "src" / "cronoq" / "proto" / "cronoq" / "v1" / "cronoq.proto"
    assert text == path.read_text(encoding="utf-8")
    assert 'syntax = "proto3";' in text
    assert "package cronoq.v1;" in text


def test_library_import_loads_neither_grpc_nor_protobuf() -> None:
    code = (
        "import sys, cronoq, cronoq.proto\n"
        "assert cronoq.proto.proto_text()\n"
        "heavy = [m for m in sys.modules if m.partition('.')[0] in ('grpc', 'google')]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_stubs_live_in_the_package_namespace() -> None:
    assert cronoq_pb2.TaskSpec.__module__ == "cronoq.proto.cronoq.v1.cronoq_pb2"
    ref = cronoq_pb2.TaskRef(key="welcome-ada")
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert cronoq_pb2_grpc.cronoq_dot_v1_dot_cronoq__pb2 is cronoq_pb2
    for service in ("Tasks", "Workers", "Admin"):
        assert hasattr(cronoq_pb2_grpc, f"{service}Stub")
        assert hasattr(cronoq_pb2_grpc, f"add_{service}Servicer_to_server")


def test_file_identity(file_proto: FileProto) -> None:
    assert file_proto.name == "cronoq/v1/cronoq.proto"
    assert file_proto.package == "cronoq.v1"
    assert file_proto.syntax == "proto3"
    assert not file_proto.dependency


def test_services_methods_and_streaming(file_proto: FileProto) -> None:
    # (method, input, output, client streaming, server streaming)
    expected = {
        "Tasks": [
            ("Submit", "SubmitRequest", "SubmitResponse", False, False),
            ("SubmitBatch", "SubmitBatchRequest", "SubmitBatchResponse", False, False),
            ("Cancel", "CancelRequest", "CancelResponse", False, False),
            ("Get", "GetRequest", "TaskInfo", False, False),
            ("ListTasks", "ListTasksRequest", "ListTasksResponse", False, False),
            ("Wait", "WaitRequest", "TaskResult", False, False),
            ("Watch", "WatchRequest", "StatusEvent", False, True),
        ],
        "Workers": [("Work", "WorkerMessage", "ServerMessage", True, True)],
        "Admin": [
            ("Snapshot", "Empty", "SnapshotResponse", False, False),
            ("AddRecurring", "RecurringRequest", "Empty", False, False),
            ("RemoveRecurring", "RemoveRecurringRequest", "RemoveRecurringResponse", False, False),
            ("ListWorkers", "Empty", "ListWorkersResponse", False, False),
            ("ListRecurring", "Empty", "ListRecurringResponse", False, False),
        ],
        # This server's addition: a service of its own, so the published ones stay as they are.
        "Operations": [
            ("PausePool", "PoolRequest", "PoolControlResponse", False, False),
            ("ResumePool", "PoolRequest", "PoolControlResponse", False, False),
            ("SearchTasks", "SearchTasksRequest", "SearchTasksResponse", False, False),
            ("BulkTasks", "BulkRequest", "BulkResponse", False, False),
        ],
    }
    actual = {
        s.name: [
            (
                m.name,
                m.input_type.removeprefix(".cronoq.v1."),
                m.output_type.removeprefix(".cronoq.v1."),
                m.client_streaming,
                m.server_streaming,
            )
            for m in s.method
        ]
        for s in file_proto.service
    }
    assert actual == expected


def test_enums(file_proto: FileProto) -> None:
    enums = {e.name: {v.name: v.number for v in e.value} for e in file_proto.enum_type}
    published = {"Priority", "TaskStatus", "EdgeCond", "MissPolicy", "Overlap"}
    assert set(enums) == published | {"TaskSort", "BulkAction"}
    assert enums["Priority"] == {
        "PRIORITY_UNSPECIFIED": 0,
        "PRIORITY_CRITICAL": 1,
        "PRIORITY_HIGH": 2,
        "PRIORITY_NORMAL": 3,
        "PRIORITY_LOW": 4,
    }
    statuses = enums["TaskStatus"]
    assert len(statuses) == 13
    assert statuses["TASK_STATUS_RUNNING"] == 4
    assert statuses["TASK_STATUS_DEAD_LETTERED"] == 8
    assert statuses["TASK_STATUS_SHED"] == 12
    assert enums["EdgeCond"]["EDGE_COND_ON_FAILURE"] == 3
    assert enums["MissPolicy"] == {
        "MISS_POLICY_UNSPECIFIED": 0,
        "MISS_POLICY_RUN_LATE": 1,
        "MISS_POLICY_SKIP": 2,
        "MISS_POLICY_FAIL": 3,
    }
    assert enums["Overlap"]["OVERLAP_QUEUE_ON_SUCCESS"] == 4


def test_task_messages(file_proto: FileProto) -> None:
    ref = _message(file_proto, "TaskRef")
    assert [o.name for o in ref.oneof_decl] == ["target"]
    assert [(f.name, f.number, f.oneof_index) for f in ref.field] == [("id", 1, 0), ("key", 2, 0)]

    spec = _fields(_message(file_proto, "TaskSpec"))
    assert len(spec) == 20
    assert (spec["priority"].number, spec["priority"].type_name) == (5, ".cronoq.v1.Priority")
    assert spec["timeout_s"].number == 14 and spec["timeout_s"].proto3_optional
    assert spec["deadline_unix_ns"].type == FieldProto.TYPE_INT64
    assert not spec["tenant"].proto3_optional and spec["tenant"].number == 20
    assert spec["deps"].label == FieldProto.LABEL_REPEATED and spec["deps"].number == 16
    entry = {n.name: n for n in _message(file_proto, "TaskSpec").nested_type}["ResourcesEntry"]
    assert entry.options.map_entry and spec["resources"].number == 17
    assert entry.field[1].type == FieldProto.TYPE_UINT32

    result = _fields(_message(file_proto, "TaskResult"))
    assert result["output"].number == 3 and result["output"].proto3_optional
    assert result["output"].type == FieldProto.TYPE_BYTES
    info = _fields(_message(file_proto, "TaskInfo"))
    assert info["finished_unix_ns"].number == 10 and info["finished_unix_ns"].proto3_optional
    assert info["priority"].number == 14


def test_worker_messages(file_proto: FileProto) -> None:
    worker = _message(file_proto, "WorkerMessage")
    assert [o.name for o in worker.oneof_decl] == ["msg"]
    assert [(f.name, f.number) for f in worker.field] == [
        ("register", 1),
        ("heartbeat", 2),
        ("complete", 3),
        ("fail", 4),
        ("set_slots", 5),
        ("nack", 6),
        ("cancelled", 7),
    ]
    server = _message(file_proto, "ServerMessage")
    assert [(f.name, f.number) for f in server.field] == [
        ("registered", 1),
        ("lease", 2),
        ("abort", 3),
        ("shutdown", 4),
    ]
    lease = _fields(_message(file_proto, "Lease"))
    assert lease["lease_ttl_s"].number == 13 and lease["lease_ttl_s"].proto3_optional
    assert lease["attempt"].type == FieldProto.TYPE_UINT32
    assert _fields(_message(file_proto, "Fail"))["retry_after_s"].proto3_optional
    registered = _fields(_message(file_proto, "Registered"))
    assert registered["max_message_bytes"].number == 5
    assert registered["max_message_bytes"].type == FieldProto.TYPE_UINT64


def test_admin_messages(file_proto: FileProto) -> None:
    recurring = _message(file_proto, "RecurringRequest")
    assert [(r.start, r.end) for r in recurring.reserved_range] == [(5, 6)]  # end is exclusive
    assert [(f.name, f.number) for f in recurring.field] == [
        ("name", 1),
        ("cron", 2),
        ("tz", 3),
        ("template", 4),
        ("overlap", 6),
    ]
    assert not _message(file_proto, "Empty").field
    pool = _fields(_message(file_proto, "PoolSnapshot"))
    assert pool["pending_by_class"].label == FieldProto.LABEL_REPEATED
    assert pool["groups"].number == 20 and pool["groups"].type_name == ".cronoq.v1.WorkerGroup"
    totals = _fields(_message(file_proto, "Totals"))
    assert len(totals) == 13 and totals["stale_completions"].number == 13
    info = _fields(_message(file_proto, "RecurringInfo"))
    assert info["last_task_id"].number == 8 and info["last_task_id"].proto3_optional
