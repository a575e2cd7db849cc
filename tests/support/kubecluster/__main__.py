"""`python -m kubecluster up` (what `make cluster` runs, with PYTHONPATH=tests/support): a real
control plane with kwok's simulated GPU nodes, the node agent's CPU node (its pods really run),
Kueue, and the chart installed by helm, so that the operator runs as a pod on the agent's node.
It prints the KUBECONFIG to use with .k8s/bin/kubectl and helm, then waits; Ctrl-C or SIGTERM
stops everything (no process, network device or mount stays)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .cluster import Cluster, ClusterOptions
from .kwok import GPU_POOL
from .processes import REPO, TOOLS, ClusterError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kubecluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the cluster and wait for Ctrl-C")
    up.add_argument(
        "--workdir", type=Path, help="keep the cluster's files here (default: a new temporary folder)"
    )
    up.add_argument("--no-kueue", action="store_true", help="without Kueue")
    up.add_argument(
        "--no-chart", action="store_true", help="without the chart (run `rlrun operator` yourself)"
    )
    return parser.parse_args(argv)


def up(args: argparse.Namespace, stop: threading.Event, started: threading.Event) -> int:
    options = ClusterOptions(workdir=args.workdir, pools=(GPU_POOL,), kueue=not args.no_kueue, agent=True)
    cluster = Cluster(options)
    print("starting the control plane, kwok's GPU nodes, the node agent, CoreDNS and Kueue ...", flush=True)
    try:
        cluster.start()
        if not args.no_chart:
            print("installing the chart (the operator runs as a pod on the agent's node) ...", flush=True)
            cluster.install_chart()
        print(
            f"\nThe cluster is up ({cluster.start_s:.0f}s); its files are in {cluster.workdir}\n"
            f"  API server: {cluster.server}\n"
            f"  container logs: {cluster.agent.logs if cluster.agent else '-'}\n"
            f"  component logs: {cluster.control_plane.logs}\n"
            f"KUBECONFIG={cluster.kubeconfig}\n\n"
            f"export KUBECONFIG={cluster.kubeconfig} PATH={TOOLS / 'bin'}:$PATH\n"
            f"kubectl apply -f {REPO / 'configs' / 'k8s' / 'rlrun.yaml'}\n"
            "kubectl get rlrun,pods -o wide -w\n\n"
            "Ctrl-C stops the cluster.",
            flush=True,
        )
        started.set()
        stop.wait()
        print("\nstopping ...", flush=True)
    finally:
        cluster.stop()
    print("stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    stop = threading.Event()

    def interrupt(*_: object) -> None:
        if stop.is_set() or not started.is_set():
            raise KeyboardInterrupt  # while starting: abort (the finally stops what started)
        stop.set()

    started = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    try:
        return up(args, stop, started)
    except ClusterError as error:
        print(f"kubecluster: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
