"""Generates src/respcoord/v1 from proto/respcoord/v1/coordinator.proto with
grpcio-tools (messages, service stubs) and mypy-protobuf (their type stubs).

    python scripts/codegen.py          # write
    python scripts/codegen.py --check  # fail if the committed files differ

The generator versions are pinned in requirements/floor.txt: grpcio-tools
1.71.2 emits messages that need protobuf >= 5.29.0, inside the range the
package supports (and pipecat-ai's >= 5.29.6, < 7)."""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from grpc_tools import protoc

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parents[1]
PROTO_ROOT = REPO / "proto"
PROTO = PROTO_ROOT / "respcoord/v1/coordinator.proto"
OUTPUT = PACKAGE / "src/respcoord/v1"
GENERATED = (
    "coordinator_pb2.py",
    "coordinator_pb2.pyi",
    "coordinator_pb2_grpc.py",
    "coordinator_pb2_grpc.pyi",
)


def generate(into: Path) -> None:
    # protoc finds the mypy plugins (protoc-gen-mypy, protoc-gen-mypy_grpc)
    # on PATH: put this interpreter's scripts directory first.
    scripts = sysconfig.get_path("scripts")
    os.environ["PATH"] = f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}"
    well_known = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={into}",
            f"--grpc_python_out={into}",
            f"--mypy_out={into}",
            f"--mypy_grpc_out={into}",
            str(PROTO),
        ]
    )
    if status != 0:
        sys.exit(f"protoc failed with status {status}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        generate(Path(temp))
        fresh = Path(temp) / "respcoord/v1"
        if not args.check:
            OUTPUT.mkdir(parents=True, exist_ok=True)
            for name in GENERATED:
                shutil.copyfile(fresh / name, OUTPUT / name)
            (OUTPUT / "__init__.py").touch()
            print(f"wrote {len(GENERATED)} files to {OUTPUT.relative_to(REPO)}")
            return 0
        stale = []
        for name in GENERATED:
            expected = (fresh / name).read_text().splitlines(keepends=True)
            committed_path = OUTPUT / name
            committed = (
                committed_path.read_text().splitlines(keepends=True)
                if committed_path.exists()
                else []
            )
            if expected != committed:
                stale.append(name)
                sys.stdout.writelines(
                    difflib.unified_diff(committed, expected, f"committed/{name}", f"proto/{name}")
                )
        if stale:
            print(
                f"\n{', '.join(stale)} differ from what {PROTO.relative_to(REPO)} generates; "
                "run clients/python/scripts/codegen.py",
                file=sys.stderr,
            )
            return 1
        print("generated stubs match the proto")
        return 0


if __name__ == "__main__":
    sys.exit(main())
