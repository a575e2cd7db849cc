"""`rlrun dashboard [DIR ...]`: serve the dashboard until Ctrl-C (or SIGTERM).

Imports nothing of the web stack at the top: the `rlrun` parser is built on every call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from rlrun.common.arguments import port
from rlrun.dashboard import registry

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7788
PORT_TRIES = 10
"""Without --port: the first free of DEFAULT_PORT .. DEFAULT_PORT + 9, else any free port."""
DEFAULT_DIR = Path("outputs")

DESCRIPTION = (
    "Serve a web page with the runs in the given folders (run folders, or folders of them such "
    "as outputs/; default: ./outputs) and the runs `rlrun local` registered: their config, phase "
    "and step, curves (train and eval reward, per env, pass@k, staleness, tokens/s, step time, "
    "dropped groups, restarts and resumes), and a trace viewer (each token's mask, loss channel, "
    "logprob and advantage). Read-only; it follows live runs. Bound to 127.0.0.1 unless --host "
    "says otherwise, which then needs --api-key-file. `rlrun local` starts one in the background "
    "when none runs (docs/dashboard.md)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="*", type=Path, metavar="DIR", help="run folders, or folders of them")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to bind (default: {DEFAULT_HOST}, loopback only)"
    )
    parser.add_argument(
        "--port",
        type=port,
        default=None,
        help=f"port (default: the first free from {DEFAULT_PORT}; 0 = OS-assigned)",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="file holding the API key every request must carry (needed off loopback): the run's "
        "key, in a cluster the Secret <run>-auth, key api-key",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="serve only DIR: not the runs `rlrun local` registered, and never become the "
        "dashboard `rlrun local` points to",
    )
    parser.add_argument(
        "--background",
        action="store_true",
        help="what `rlrun local` starts: serve the registered runs only, and exit at once when "
        "another dashboard already serves them",
    )
    parser.add_argument(
        "--orchestrator",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="also show the run behind this orchestrator's status service (a cluster run through "
        "`kubectl port-forward`): its phase, step and curves from the moment the dashboard watches "
        "(repeatable)",
    )
    parser.add_argument(
        "--orchestrator-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the run's gRPC bearer token for --orchestrator (grpc.auth_token_file; in a cluster the "
        "Secret <run>-auth, key token)",
    )
    parser.add_argument(
        "--orchestrator-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="CA bundle to verify --orchestrator's TLS certificate (turns TLS on)",
    )
    parser.add_argument(
        "--stop", action="store_true", help="stop the dashboard `rlrun local` points to, and exit"
    )


def _fail(message: str) -> int:
    print(f"rlrun dashboard: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    if args.stop:
        try:
            pid = registry.stop()
        except registry.DashboardUnavailable as error:
            return _fail(str(error))
        print(f"rlrun dashboard: {'stopped pid ' + str(pid) if pid else 'none was running'}", file=sys.stderr)
        return 0
    from rlrun.common.grpc_server import read_token_file
    from rlrun.dashboard.security import AccessError, check_bind, is_loopback

    try:
        api_key = read_token_file(args.api_key_file) if args.api_key_file else None
    except (OSError, ValueError) as error:
        return _fail(f"--api-key-file: {error}")
    try:
        token = read_token_file(args.orchestrator_token_file) if args.orchestrator_token_file else None
    except (OSError, ValueError) as error:
        return _fail(f"--orchestrator-token-file: {error}")
    if args.orchestrator_ca is not None and not args.orchestrator_ca.is_file():
        return _fail(f"--orchestrator-ca: no such file: {args.orchestrator_ca}")
    try:
        check_bind(args.host, api_key)
    except AccessError as error:
        return _fail(str(error))
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        return _fail(f"DIR: no such folder: {', '.join(missing)}")
    folders = list(args.dirs)
    if not folders and not args.background and DEFAULT_DIR.is_dir():
        folders = [DEFAULT_DIR]
    shared = not args.isolated
    from rlrun.common.grpc_client import ClientOptions
    from rlrun.common.ports import CannotBind
    from rlrun.dashboard.app import create_app
    from rlrun.dashboard.remote import RemoteRun
    from rlrun.dashboard.runs import RunSources

    options = ClientOptions(deadline_s=10.0, retries=1, tls_ca=args.orchestrator_ca, auth_token=token)
    remote = [RemoteRun(address, options) for address in args.orchestrator]
    sources = RunSources(folders, registry.registered if shared else None, remote)
    app = create_app(sources, loopback=is_loopback(args.host), api_key=api_key)
    try:
        return asyncio.run(_serve(app, args, shared, len(sources.runs()), remote))
    except CannotBind as error:
        return _fail(str(error))


def _bind(app, host: str, wanted: int | None):
    """On --port, that port or an error naming it; else the first free of the default ports."""
    from rlrun.common.http_server import HttpServer
    from rlrun.common.ports import CannotBind, listen_socket

    if wanted is not None:
        return HttpServer(app, listen_socket(host, wanted, "the dashboard", "--port"))
    for candidate in range(DEFAULT_PORT, DEFAULT_PORT + PORT_TRIES):
        with contextlib.suppress(CannotBind):
            return HttpServer(app, listen_socket(host, candidate, "the dashboard", "--port"))
    return HttpServer(app, listen_socket(host, 0, "the dashboard", "--port"))


async def _serve(app, args: argparse.Namespace, shared: bool, runs: int, remote) -> int:
    server = _bind(app, args.host, args.port)
    await server.start()
    watchers = [asyncio.create_task(run.watch(), name=f"watch {run.address}") for run in remote]
    try:
        if shared:
            other = await asyncio.to_thread(registry.claim, server.url)
            if other is not None and args.background:
                print(f"rlrun dashboard: {other['url']} already serves the registered runs", file=sys.stderr)
                return 0
        print(
            f"rlrun dashboard: {server.url}/ ({runs} run{'' if runs == 1 else 's'}; Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        return 0
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        if shared:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(registry.release)
        await server.stop()
