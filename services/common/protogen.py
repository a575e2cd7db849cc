"""Generates the Python code for proto/rlrun/v1 into services/v1 (`make proto`), in the checkout
named by `--root` (default: the current directory).

The generated modules import each other as `rlrun.v1.*`, which resolves because
`services/` is installed as the package `rlrun`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

INIT_TEXT = '"""Generated protobuf and gRPC code for rlrun.v1 (`make proto`; never edit by hand)."""\n'


def generate(root: Path, out_dir: Path) -> list[Path]:
    """Generates every module of the checkout at `root` into out_dir (which ends up holding
    rlrun/v1/*.py{,i})."""
    from grpc_tools import protoc

    proto_root = root / "proto"
    protos = sorted(str(p.relative_to(proto_root)) for p in (proto_root / "rlrun" / "v1").glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{proto_root}",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlrun.common.protogen", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="the checkout (default: the current directory)"
    )
    root = (parser.parse_args(argv).root or Path.cwd()).resolve()
    generated_dir = root / "services" / "v1"
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(root, Path(tmp))
        for stale in generated_dir.glob("*_pb2*.py*"):
            stale.unlink()
        generated_dir.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(path, generated_dir / path.name)
    print(f"generated {len(files)} files into {generated_dir.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
