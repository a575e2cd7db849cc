"""`rlrun bench async`: what overlapping generation and training buys.

The demo config runs twice through the real `rlrun local` stack: synchronous
(`max_off_policy_steps = 0`: generate with the current policy, then train) and async (= 1:
generation of step n+1 overlaps training of step n). In the sync run a step is generation
then training, so generation = step - training (the orchestrator's own `gen_seconds` also
counts the wait for the training that gates it). The bound on the speed-up is
(gen + train) / max(gen, train); the figure of merit is the measured speed-up as a fraction
of that bound.
"""

from __future__ import annotations

import argparse

from rlrun.bench import emit_result
from rlrun.bench.local_runs import DEMO_CONFIG, run_local, timing_overrides


def main(args: argparse.Namespace) -> int:
    steps = 12 if args.quick else 60
    common = timing_overrides(steps)
    sync = run_local(DEMO_CONFIG, [*common, "orchestrator.max_off_policy_steps=0"], "sync")
    overlapped = run_local(DEMO_CONFIG, [*common, "orchestrator.max_off_policy_steps=1"], "async")
    sync_step = sync.rl_seconds / sync.steps
    train = sync.median("train_seconds")
    gen = sync_step - train
    bound = (gen + train) / max(gen, train)
    async_step = overlapped.rl_seconds / overlapped.steps
    speedup = sync_step / async_step
    result = {
        "benchmark": "async",
        "quick": args.quick,
        "steps": steps,
        "sync_step_ms": sync_step * 1e3,
        "async_step_ms": async_step * 1e3,
        "gen_ms": gen * 1e3,
        "train_ms": train * 1e3,
        "speedup": speedup,
        "bound": bound,
        "ratio_vs_bound": speedup / bound,
        "async_off_policy_lag": overlapped.median("off_policy_lag"),
    }
    print(
        f"sync step {result['sync_step_ms']:.1f} ms (generation {result['gen_ms']:.1f} ms + training "
        f"{result['train_ms']:.1f} ms), async step {result['async_step_ms']:.1f} ms"
    )
    print(
        f"speed-up {speedup:.2f}x of a possible {bound:.2f}x: ratio_vs_bound = {speedup / bound:.2f} (target >= 0.9)"
    )
    return emit_result(result, args)
