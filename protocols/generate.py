"""Regenerate the committed gRPC/protobuf code of geofl's wire protocol.

The generator is pinned (grpcio-tools 1.81.1, see pyproject's dev extra): code it
emits imports under protobuf 6.x (the range flwr 1.42 requires) and 7.x, so geofl
and Flower can share one environment.  ``--check`` regenerates into a temporary
folder and fails if the committed files differ (the drift test runs it).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PINNED_GRPCIO_TOOLS = "1.81.1"
ROOT = Path(__file__).resolve().parents[1]  # the repository root (protocols/..)
PROTO_DIR = ROOT / "protocols" / "v1"
# The import path inside generated code follows the path under the include root,
# so the sources are staged as geofl/protocols/v1/*.proto.
PACKAGE_PATH = Path("geofl") / "protocols" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _check_generator_version() -> None:
    from importlib.metadata import version

    found = version("grpcio-tools")
    if found != PINNED_GRPCIO_TOOLS:
        sys.exit(f"grpcio-tools {PINNED_GRPCIO_TOOLS} is required, found {found}")


def generate(out_dir: Path) -> list[Path]:
    """Generate code for every .proto in protocols/v1 into ``out_dir``."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "src" / PACKAGE_PATH
        staged.mkdir(parents=True)
        protos = sorted(PROTO_DIR.glob("*.proto"))
        for proto in protos:
            shutil.copy(proto, staged / proto.name)
        gen = Path(tmp) / "gen"
        gen.mkdir()
        args = [
            "protoc",
            f"-I{Path(tmp) / 'src'}",
            f"--python_out={gen}",
            f"--pyi_out={gen}",
            f"--grpc_python_out={gen}",
            *[str(PACKAGE_PATH / p.name) for p in protos],
        ]
        if protoc.main(args) != 0:
            sys.exit("protoc failed")
        written = []
        for path in sorted((gen / PACKAGE_PATH).iterdir()):
            if path.name.endswith(GENERATED_SUFFIXES):
                shutil.copy(path, out_dir / path.name)
                written.append(out_dir / path.name)
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args()
    _check_generator_version()
    if not args.check:
        for path in generate(PROTO_DIR):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [p.name for p in fresh if not filecmp.cmp(p, PROTO_DIR / p.name, shallow=False)]
    if stale:
        print("generated protocol code is stale: " + ", ".join(stale), file=sys.stderr)
        print("run: python -m geofl.protocols.generate", file=sys.stderr)
        return 1
    print("generated protocol code is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
