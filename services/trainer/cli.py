"""`rlrun serve trainer` arguments (light: no torch at import) and entry point."""

from __future__ import annotations

import argparse

from rlrun.common.config import RunConfig

DESCRIPTION = (
    "The trainer: the learner. It builds the model (on every rank under torchrun), trains on "
    "the batches the orchestrator sends (TrainerService), broadcasts new weights to the "
    "inference services, and saves checkpoints. It resumes from the newest complete checkpoint "
    "under <output_dir>/checkpoints when there is one (--fresh starts over)."
)
"""What `rlrun serve ... --help` says the service does."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="delete the checkpoints under <output_dir>/checkpoints and start from the configured "
        "model instead of resuming from the newest one",
    )


def main(config: RunConfig, args: argparse.Namespace) -> int:
    from rlrun.trainer.app import main as run

    return run(config, args)
