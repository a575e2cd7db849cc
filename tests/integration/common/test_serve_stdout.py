"""A served process's stdout carries its ready line and nothing else: whatever else is written
there (print, a library writing to file descriptor 1, a child process) goes to stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from rlrun.common.grpc_client import wait_for_health

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SCRIPT = textwrap.dedent(
    """
    import argparse
    import os
    import subprocess
    import sys

    from rlrun.common.config import load_config
    from rlrun.common.service import serve_main

    async def setup(ctx):
        print("noise from print", flush=True)
        os.write(1, b"noise on file descriptor 1\\n")
        subprocess.run(["echo", "noise from a child process"], check=True)
        return None

    config = load_config(sys.argv[1], [f'output_dir="{sys.argv[2]}"'])
    args = argparse.Namespace(host="127.0.0.1", port=0, log_dir=sys.argv[2], metrics_port=None)
    sys.exit(serve_main("noisy", config, args, [], setup))
    """
)


async def test_stdout_carries_only_the_ready_line(tmp_path):
    script = tmp_path / "noisy.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), os.path.join(REPO, "configs/reverse_text.toml"), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("rlrun noisy listening on 127.0.0.1:"), (line, proc.poll())
        await wait_for_health(line.rsplit(" ", 1)[1].strip(), timeout_s=10)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out == ""
    for noise in ("noise from print", "noise on file descriptor 1", "noise from a child process"):
        assert noise in err
