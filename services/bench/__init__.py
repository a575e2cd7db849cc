"""Benchmarks, run as `rlrun bench NAME`: each measures a baseline in the same run, prints the
ratio against it, and ends with one JSON line."""

from __future__ import annotations

import argparse
import json
import sys
import time

_STARTED = time.perf_counter()


def stage(what: str) -> None:
    """Says on stderr what a benchmark measures now (stdout keeps the results): most take
    a minute or more."""
    print(f"[{time.perf_counter() - _STARTED:6.1f}s] {what}", file=sys.stderr, flush=True)


def emit_result(result: dict, args: argparse.Namespace) -> int:
    """Prints the result as the last output line (and writes it to --output); the exit code."""
    line = json.dumps(result)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(line + "\n")
    print(line, flush=True)
    return 0
