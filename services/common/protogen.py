"""Generates the Python code for proto/rlrun/v1 into services/v1 (`make proto`).

The generated modules import each other as `rlrun.v1.*`, which resolves because
`services/` is installed as the package `rlrun`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "rlrun" / "v1"
GENERATED_DIR = REPO_ROOT / "services" / "v1"

INIT_TEXT = '"""Generated protobuf and gRPC code for rlrun.v1 (`make proto`; never edit by hand)."""\n'


def generate(out_dir: Path) -> list[Path]:
    """Generates every module into out_dir (which ends up holding rlrun/v1/*.py{,i})."""
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {protos}")
    generated = out_dir / "rlrun" / "v1"
    (generated / "__init__.py").write_text(INIT_TEXT)
    return sorted(generated.iterdir())


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        for stale in GENERATED_DIR.glob("*_pb2*.py*"):
            stale.unlink()
        GENERATED_DIR.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(path, GENERATED_DIR / path.name)
    print(f"generated {len(files)} files into {GENERATED_DIR.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
