"""`rlrun bench sandbox`: what the `local` sandbox runtime (bubblewrap) costs.

1. `sandboxes_per_s`: sandboxes created (with one task file) and destroyed, one after another;
   `sandboxes_with_command_per_s`: the same with one command (`true`) run in each, which is
   what an episode of the code-sandbox env costs at least.
2. Per-command overhead: the same command (`true`, then `/usr/bin/python3 -c pass`: the same interpreter both ways) run in one sandbox
   and directly (`sh -c`, as a subprocess of this process), alternating; medians.
   `ratio_vs_direct` = sandboxed / direct time of `true`; `overhead_ms` their difference;
   `python_ratio_vs_direct` the same for python.

The last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from rlrun.bench import emit_result, stage
from rlrun.env_server.runtimes.local import LocalRuntime
from rlrun.env_server.sdk.sandbox import Sandbox

FILES = {"task.py": "print('hello')\n"}


async def _direct(command: str) -> None:
    process = await asyncio.create_subprocess_exec(
        "sh", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{command!r} failed directly")


async def _sandboxed(sandbox: Sandbox, command: str) -> None:
    if not (await sandbox.run(command)).ok:
        raise RuntimeError(f"{command!r} failed in the sandbox")


async def _timed(call) -> float:
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


async def _churn(runtime: LocalRuntime, count: int, command: str | None) -> float:
    started = time.perf_counter()
    for _ in range(count):
        sandbox = await runtime.create(FILES)
        try:
            if command is not None:
                await _sandboxed(sandbox, command)
        finally:
            sandbox.close()
    return count / (time.perf_counter() - started)


async def _overhead(runtime: LocalRuntime, command: str, rounds: int) -> tuple[float, float]:
    """Median seconds of `command` sandboxed and direct, alternating."""
    sandbox = await runtime.create(FILES)
    sandboxed, direct = [], []
    try:
        for _ in range(rounds):
            sandboxed.append(await _timed(_sandboxed(sandbox, command)))
            direct.append(await _timed(_direct(command)))
    finally:
        sandbox.close()
    return statistics.median(sandboxed), statistics.median(direct)


async def _measure(quick: bool) -> dict:
    runtime = LocalRuntime()
    churn, rounds = (10, 10) if quick else (200, 100)
    stage(f"{churn} sandboxes created and destroyed")
    per_s = await _churn(runtime, churn, None)
    stage(f"{churn} sandboxes with one command each")
    with_command = await _churn(runtime, churn, "true")
    stage(f"`true` sandboxed vs direct, {rounds} rounds")
    true_box, true_direct = await _overhead(runtime, "true", rounds)
    stage(f"`/usr/bin/python3 -c pass` sandboxed vs direct, {rounds} rounds")
    py_box, py_direct = await _overhead(runtime, "/usr/bin/python3 -c pass", rounds)
    return {
        "benchmark": "sandbox",
        "quick": quick,
        "sandboxes_per_s": per_s,
        "sandboxes_with_command_per_s": with_command,
        "command_ms": true_box * 1e3,
        "direct_ms": true_direct * 1e3,
        "overhead_ms": (true_box - true_direct) * 1e3,
        "ratio_vs_direct": true_box / true_direct,
        "python_command_ms": py_box * 1e3,
        "python_direct_ms": py_direct * 1e3,
        "python_ratio_vs_direct": py_box / py_direct,
    }


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(_measure(args.quick))
    print(
        f"{result['sandboxes_per_s']:.0f} sandboxes/s created and destroyed, "
        f"{result['sandboxes_with_command_per_s']:.1f}/s with one command; `true` takes "
        f"{result['command_ms']:.1f} ms sandboxed vs {result['direct_ms']:.1f} ms directly "
        f"(ratio_vs_direct = {result['ratio_vs_direct']:.1f}, overhead {result['overhead_ms']:.1f} ms); "
        f"`/usr/bin/python3 -c pass`: ratio {result['python_ratio_vs_direct']:.2f}"
    )
    return emit_result(result, args)
