"""Regenerate the Python stubs of cronoq/v1/cronoq.proto with grpcio-tools.

    .venv/bin/python scripts/gen_proto.py              # into src/cronoq/proto/cronoq/v1/
    .venv/bin/python scripts/gen_proto.py --out DIR    # elsewhere (the staleness test)

protoc names the generated modules after the proto's path (`cronoq.v1.cronoq_pb2`), but inside
the package they live at `cronoq.proto.cronoq.v1`; the proto's own path must stay
`cronoq/v1/cronoq.proto` because the descriptor's file name is part of the wire contract. So
the output is generated into a scratch directory, its two references to the protoc module
name are rewritten, and the result is written out. Output is byte for byte reproducible for a
given grpcio-tools version, which is why the test extra pins it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[1] / "src" / "cronoq" / "proto"
PROTO = "cronoq/v1/cronoq.proto"
STUBS_DIR = PROTO_ROOT / "cronoq" / "v1"
PACKAGE = "cronoq.proto.cronoq.v1"

# (file, what protoc writes, what the package needs): each must occur exactly once.
_FIXES = {
    "cronoq_pb2.py": [
        ("'cronoq.v1.cronoq_pb2'", f"'{PACKAGE}.cronoq_pb2'"),
    ],
    "cronoq_pb2_grpc.py": [
        ("from cronoq.v1 import cronoq_pb2 as", f"from {PACKAGE} import cronoq_pb2 as"),
    ],
    "cronoq_pb2.pyi": [],
}
STUBS = tuple(_FIXES)


def generate(out_dir: Path) -> list[Path]:
    """Generate the stubs into `out_dir` and return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--proto_path={PROTO_ROOT}",
                f"--python_out={scratch}",
                f"--pyi_out={scratch}",
                f"--grpc_python_out={scratch}",
                PROTO,
            ],
            check=True,
        )
        written = []
        for name, fixes in _FIXES.items():
            text = (Path(scratch) / "cronoq" / "v1" / name).read_text(encoding="utf-8")
            for old, new in fixes:
                if text.count(old) != 1:
                    raise RuntimeError(f"{name}: expected {old!r} exactly once in protoc output")
                text = text.replace(old, new)
            target = out_dir / name
            target.write_bytes(text.encode("utf-8"))
            written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=STUBS_DIR, help="output directory")
    for path in generate(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
