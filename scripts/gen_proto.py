"""Regenerate the Python code of the v1 contract from its .proto files, or check it is current.

The .proto files under ``proto/remote_partitioner/v1/`` are the single source of truth. The
generated modules live in ``proto/v1/`` so that they import as ``remote_partitioner.proto.v1``::

    python scripts/gen_proto.py          # regenerate (``make proto``)
    python scripts/gen_proto.py --check  # exit 1 when the generated code is stale (CI)
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "proto" / "remote_partitioner" / "v1"
TARGET = ROOT / "proto" / "v1"
# The virtual include path makes the generated modules import each other as
# ``remote_partitioner.proto.v1.*``, where the package installs them.
VIRTUAL = "remote_partitioner/proto/v1"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    """Run protoc over every .proto in SOURCE into ``out``; return the generated files."""
    protos = sorted(SOURCE.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{VIRTUAL}={SOURCE}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(f"{VIRTUAL}/{p.name}" for p in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / VIRTUAL).glob("*_pb2*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when generated code is stale")
    check = parser.parse_args().check
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        current = {p.name: p for p in TARGET.iterdir() if p.name.endswith(SUFFIXES)}
        if check:
            stale = sorted(
                name
                for name in fresh.keys() | current.keys()
                if name not in fresh
                or name not in current
                or not filecmp.cmp(fresh[name], current[name], shallow=False)
            )
            if stale:
                print(f"generated code is stale: {', '.join(stale)}; run `make proto`")
                return 1
            print(f"generated code is current ({len(fresh)} files)")
            return 0
        for name, path in current.items():
            if name not in fresh:
                path.unlink()
        for name, path in fresh.items():
            shutil.copyfile(path, TARGET / name)
        print(f"wrote {len(fresh)} files to {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
