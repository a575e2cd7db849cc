"""`python -m kubecluster.agent CONFIG.json`: the node agent's process (started by NodeAgent as
PID 1 of a PID namespace of its own, see kubelet.run_as_init)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from .config import AgentConfig
from .kubelet import run_as_init, serve


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    config = AgentConfig.load(Path(sys.argv[1]))
    return run_as_init(lambda: serve(config))


if __name__ == "__main__":
    sys.exit(main())
