"""`rlrun serve trainer` arguments (light: no torch at import) and entry point."""

from __future__ import annotations

import argparse

from rlrun.common.config import RunConfig

DESCRIPTION = (
    "The trainer: the learner. It builds the model (on every rank under torchrun), trains on "
    "the batches the orchestrator sends (TrainerService), broadcasts new weights to the "
    "inference services, and saves checkpoints (--resume continues from one)."
)
"""What `rlrun serve ... --help` says the service does."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        default=None,
        metavar="PATH|latest",
        help="resume from a checkpoint folder, or `latest` under <output_dir>/checkpoints "
        "(a fresh start when there is none yet)",
    )


def main(config: RunConfig, args: argparse.Namespace) -> int:
    from rlrun.trainer.app import main as run

    return run(config, args)
