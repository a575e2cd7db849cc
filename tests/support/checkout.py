"""A fresh checkout of this repository for a test: the files git tracks, as a clone has them
(symlinks kept), and nothing a run or a build left behind (no outputs/, no caches)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
"""The virtualenv's bin folder: `rlrun` and `python` as a user runs them."""


def fresh_checkout(dest: Path) -> Path:
    """Copies every tracked file of the working tree (as it is now) into `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree, not yet in the index
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return dest


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: the virtualenv's bin first on PATH, one thread."""
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
        "OMP_NUM_THREADS": "1",
        **extra,
    }
