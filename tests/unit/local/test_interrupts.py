"""Ctrl-C stops the launcher even where an awaited call swallows asyncio's cancellation."""

import subprocess
import sys

# The launcher's loop, reduced to a coroutine that, like a library might, swallows the
# cancellation asyncio.run's own Ctrl-C handling sends it (once) and carries on.
SCRIPT = """
import asyncio, os, signal, sys
from rlrun.local.launcher import interrupts_raise

async def stubborn():
    asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
    for _ in range(20):
        try:
            await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            pass
    return "carried on"

try:
    if sys.argv[1] == "launcher":
        with interrupts_raise():
            print(asyncio.run(stubborn()))
    else:
        print(asyncio.run(stubborn()))
except KeyboardInterrupt:
    print("interrupted")
"""


def run(mode: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_ctrl_c_interrupts_a_loop_that_swallows_the_cancellation():
    assert run("plain") == "carried on"  # what asyncio.run alone does
    assert run("launcher") == "interrupted"
