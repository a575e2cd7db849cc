"""`rlrun bench operator-scale`: the operator with many runs, on a real control plane.

The control plane is the tests' own (tests/support/kubecluster of an rlrun checkout: etcd,
kube-apiserver, controller-manager, scheduler and kwok's simulated CPU and GPU nodes, no
Kueue); the chart is installed by helm with every run namespace in `operator.runNamespaces`,
and the operator runs as a separate process, `rlrun operator --all-namespaces`, with a token of
the chart's ServiceAccount. Every run is configs/k8s/rlrun.yaml under another name, with 3
inference replicas and 5 env-servers: 10 pods a run. Three phases, each ended by deleting its
runs (and waiting until their pods are gone):

- baseline: 1 run;
- one namespace: `--runs` runs (default 50, about 500 pods) created at once in one namespace;
- namespaces: as many runs spread over `--namespaces` namespaces (default 10).

Every time of a phase starts at the API server's answer to the create of its first RLRun.
Per phase, from the API server's audit log (one event per request):

- the reconcile latency of each run: from the API server's answer to the `kubectl create` of
  the RLRun to the operator's creation of the last of its children (every object
  `desired_state` renders for it), p50 and p99;
- how long until every pod of the phase is created (by the StatefulSet and ReplicaSet
  controllers, from the operator's workloads);
- reconcile passes per run (its own metrics, `rlrun_operator_reconciles_total`, every
  handler) and API requests per pass: the requests of the operator's ServiceAccount over those
  passes;
- the operator's CPU seconds per pass and its RSS (from /proc);
- how long until every status is right (polled each second): every pod of every run Ready and
  every run's status what status.py makes of a run whose pods are all up and whose orchestrator
  does not answer (kwok's pods run nothing): `observedGeneration` current, phase Pending,
  ConfigValid, InferenceReady, EnvServersReady and TrainerReady True, Progressing, Degraded and
  Restarted False.

Then a steady window of status passes: requests per pass and per run and minute, passes done
against those the interval asks for. The ratios compare the many-run phase with the 1-run
baseline and the spread phase with the one-namespace phase. The last stdout line is JSON.
`--quick`: 5 runs, 2 namespaces.

Run it from a checkout (or pass `--root`) after `make k8s-tools`. This module imports nothing
heavy at the top: `rlrun` builds its parser from it on every call.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import importlib
import json
import math
import os
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rlrun.bench import emit_result, stage
from rlrun.common.arguments import positive

SUPPORT = Path("tests/support")
CHART = Path("charts/rlrun")
SAMPLE = Path("configs/k8s/rlrun.yaml")
OPERATOR_NAMESPACE = "rlrun-system"
RELEASE = "rlrun"
RUN_LABEL = "rlrun.dev/run"
INFERENCE_REPLICAS = 3
ENV_SERVER_REPLICAS = 5
"""With the trainer and the orchestrator: 10 pods a run."""
RIGHT_CONDITIONS = {
    "ConfigValid": "True",
    "InferenceReady": "True",
    "EnvServersReady": "True",
    "TrainerReady": "True",
    "Progressing": "False",
    "Degraded": "False",
    "Restarted": "False",
}
RIGHT_PHASE = "Pending"
"""What the status of a run says once its pods are all up and its orchestrator does not answer
(status.py: a poll without an answer keeps a run that never ran Pending, and Degraded speaks of
the orchestrator only while the run is Running)."""


@dataclass(frozen=True)
class Size:
    runs: int
    namespaces: int
    cpu_nodes: int
    gpu_nodes: int
    status_interval_s: float
    timeout_s: float


QUICK = Size(runs=5, namespaces=2, cpu_nodes=2, gpu_nodes=1, status_interval_s=2.0, timeout_s=300)
FULL = Size(runs=50, namespaces=10, cpu_nodes=20, gpu_nodes=4, status_interval_s=2.0, timeout_s=900)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        type=Path,
        default=Path.cwd(),
        help="the rlrun checkout whose test control plane (tests/support/kubecluster, with the "
        "binaries of `make k8s-tools`), chart and sample run the bench uses (default: the current directory)",
    )
    parser.add_argument(
        "--runs",
        type=positive,
        metavar="N",
        help=f"runs per phase (default: {FULL.runs}; {QUICK.runs} with --quick)",
    )
    parser.add_argument(
        "--namespaces",
        type=positive,
        metavar="N",
        help=f"namespaces of the spread phase (default: {FULL.namespaces}; {QUICK.namespaces} with --quick)",
    )


def load_kubecluster(root: Path) -> ModuleType:
    """The test control plane of the rlrun checkout at `root` (tests/support/kubecluster): the
    bench starts the very cluster the operator tests run against. SystemExit, naming what is
    missing, anywhere else (an installed rlrun has no tests)."""
    missing = [str(path) for path in (SUPPORT / "kubecluster", CHART, SAMPLE) if not (root / path).exists()]
    if missing:
        raise SystemExit(
            f"rlrun bench operator-scale: {root.resolve()} is not an rlrun checkout (no "
            f"{', '.join(missing)}); run it from one, or pass --root CHECKOUT"
        )
    sys.path.insert(0, str((root / SUPPORT).resolve()))
    return importlib.import_module("kubecluster")


# --- what the bench reads


def _time(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


class AuditLog:
    """The API server's audit log, read on from where the last `read` stopped."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _proc(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS KiB, peak RSS KiB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return cpu_s, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


@dataclass
class Usage:
    """One reading of the operator: its passes by handler (its own metrics) and /proc."""

    at: float
    passes: Counter[str]
    cpu_s: float
    rss_kib: int
    peak_rss_kib: int


class Operator:
    """`rlrun operator --all-namespaces`, a process of its own, as the chart's ServiceAccount."""

    def __init__(self, kubecluster: ModuleType, cluster: Any, status_interval_s: float):
        processes = kubecluster.processes
        account = cluster.get_json(
            "serviceaccount", "-n", OPERATOR_NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}"
        )["items"][0]["metadata"]["name"]
        self.user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{account}"
        kubeconfig = cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, account)
        # The key the chart generated, as the operator's pod mounts it.
        secrets = cluster.get_json("secret", "-n", OPERATOR_NAMESPACE)["items"]
        (secret,) = [s for s in secrets if s["metadata"]["name"].endswith("token-key")]
        key = cluster.workdir / "token-key"
        key.write_bytes(base64.b64decode(secret["data"]["key"]))
        key.chmod(0o600)
        self.metrics_port = processes.free_port()
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env |= {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": OPERATOR_NAMESPACE}
        self.process = processes.Process(
            "rlrun-operator",
            [
                sys.executable,
                "-m",
                "rlrun.cli",
                "operator",
                "--all-namespaces",
                f"--status-interval={status_interval_s}",
                f"--metrics-port={self.metrics_port}",
                "--liveness-port=0",
                f"--token-key-file={key}",
            ],
            cluster.control_plane.logs,
            env=env,
        )
        try:
            processes.wait_for(self.usage, 60, "the operator's /metrics", self.process)
        except BaseException:
            self.process.stop()
            raise

    def usage(self) -> Usage:
        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        passes: Counter[str] = Counter()
        for family in text_string_to_metric_families(text):
            if family.name == "rlrun_operator_reconciles":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        passes[sample.labels["handler"]] = int(sample.value)
        return Usage(time.monotonic(), passes, *_proc(self.process.pid))

    def check(self) -> None:
        if self.process.exited():
            raise RuntimeError(f"the operator exited ({self.process.returncode()}):\n{self.process.tail()}")


# --- the runs


def scale_run(sample: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    run = json.loads(json.dumps(sample))
    run["metadata"] = {"name": name, "namespace": namespace}
    spec = run["spec"]
    spec["inference"]["replicas"] = INFERENCE_REPLICAS
    for env_server in spec["envServers"]:
        env_server["replicas"] = ENV_SERVER_REPLICAS
    return run


@dataclass(frozen=True)
class Expected:
    """What the operator makes of one run: its children (resource, name) and its pod count."""

    children: frozenset[tuple[str, str]]
    pods: int


def expected(run: dict[str, Any]) -> Expected:
    from rlrun.operator.kube import PLURALS
    from rlrun.operator.reconcile import desired_state

    state = desired_state({**run, "metadata": {**run["metadata"], "uid": "0"}})
    if state.error is not None:
        raise RuntimeError(f"the bench's run is invalid: {state.error}")
    children = frozenset(
        (PLURALS[(o["apiVersion"], o["kind"])], o["metadata"]["name"]) for o in state.objects
    )
    return Expected(children, sum(w.replicas for w in state.workloads))


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def status_wrong(run: dict[str, Any] | None) -> str:
    """What is not yet right in a run's status ("" when it is right)."""
    if run is None:
        return "missing"
    status = run.get("status") or {}
    if status.get("observedGeneration") != run["metadata"].get("generation"):
        return f"observedGeneration {status.get('observedGeneration')}"
    if status.get("phase") != RIGHT_PHASE:
        return f"phase {status.get('phase')}"
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    for kind, want in RIGHT_CONDITIONS.items():
        have = conditions.get(kind) or {}
        if have.get("status") != want:
            return f"{kind}={have.get('status')} ({have.get('reason')}: {have.get('message')})"
    return ""


class Watcher:
    """The admin's view of the runs: their statuses, then (once every status is right) their pods."""

    def __init__(self, api_client: Any):
        import kubernetes

        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)

    def runs(self) -> dict[tuple[str, str], dict[str, Any]]:
        items = self.custom.list_cluster_custom_object("rlrun.dev", "v1alpha1", "rlruns")["items"]
        return {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in items}

    def pods(self) -> list[dict[str, Any]]:
        response = self.core.list_pod_for_all_namespaces(label_selector=RUN_LABEL, _preload_content=False)
        return json.loads(response.data)["items"]

    def wrong(self, runs: dict[tuple[str, str], Expected]) -> tuple[int, int, str]:
        """(runs whose status is right, pods Ready, what the first wrong run lacks); the pods
        are counted only once every status is right."""
        live = self.runs()
        wrong = {key: status_wrong(live.get(key)) for key in runs}
        right = sum(1 for why in wrong.values() if not why)
        if right < len(runs):
            key, why = next((k, w) for k, w in wrong.items() if w)
            return right, 0, f"{key[0]}/{key[1]}: {why}"
        ready: Counter[tuple[str, str]] = Counter(
            (p["metadata"]["namespace"], p["metadata"]["labels"][RUN_LABEL]) for p in self.pods() if _ready(p)
        )
        short = [(key, ready[key], want.pods) for key, want in runs.items() if ready[key] != want.pods]
        if short:
            (namespace, name), have, want = short[0]
            return right, sum(ready.values()), f"{namespace}/{name}: {have}/{want} pods Ready"
        return right, sum(ready.values()), ""

    def gone(self, namespaces: set[str]) -> tuple[int, int]:
        """(RLRuns, pods of runs) left in `namespaces`."""
        runs = sum(1 for namespace, _ in self.runs() if namespace in namespaces)
        pods = sum(1 for p in self.pods() if p["metadata"]["namespace"] in namespaces)
        return runs, pods


def wait(
    what: str,
    check: Callable[[], tuple[bool, str]],
    timeout_s: float,
    operator: Operator,
    every_s: float = 1.0,
) -> float:
    """Polls `check` (done, progress) until done; the progress goes to stderr every 10 s."""
    started = time.monotonic()
    shown = started
    while True:
        operator.check()
        done, progress = check()
        now = time.monotonic()
        if done:
            return time.time()
        if now - started > timeout_s:
            raise RuntimeError(f"{what}: not done after {timeout_s:.0f}s: {progress}")
        if now - shown >= 10:
            stage(f"{what}: {progress}")
            shown = now
        time.sleep(every_s)


# --- one phase


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


STEADY_INTERVALS = 5
"""How long the steady state is measured after every status is right, in status intervals."""


@dataclass
class Window:
    """What the operator did between two readings: its reconcile passes, its API requests by
    call ("verb resource") and its CPU time."""

    seconds: float
    passes: int
    requests_by_call: Counter[str]
    cpu_s: float

    def figures(self) -> dict[str, Any]:
        passes = max(self.passes, 1)
        requests = sum(self.requests_by_call.values())
        return {
            "passes": self.passes,
            "requests": requests,
            "requests_per_pass": round(requests / passes, 2),
            "cpu_ms_per_pass": round(self.cpu_s / passes * 1e3, 2),
            "operator_cpu_cores": round(self.cpu_s / self.seconds, 3),
            "requests_per_pass_by_call": {
                call: round(count / passes, 2) for call, count in self.requests_by_call.most_common()
            },
        }


@dataclass
class Phase:
    runs: int
    namespaces: int
    pods: int
    latencies_s: list[float]
    pods_created_s: float
    right_s: float
    cleanup_s: float
    rss_mib: float
    whole: Window
    """From the create of the runs until every status is right."""
    steady: Window
    """The status timer's passes once every run is up: what one poll of a run costs."""
    status_interval_s: float

    def figures(self) -> dict[str, Any]:
        wanted = self.runs * self.steady.seconds / self.status_interval_s
        steady_requests = sum(self.steady.requests_by_call.values())
        return {
            "runs": self.runs,
            "namespaces": self.namespaces,
            "pods": self.pods,
            "latency_p50_s": round(statistics.median(self.latencies_s), 4),
            "latency_p99_s": round(_percentile(self.latencies_s, 0.99), 4),
            "latency_max_s": round(max(self.latencies_s), 4),
            "pods_created_s": round(self.pods_created_s, 3),
            "right_s": round(self.right_s, 3),
            # Until every status is right: passes of every handler (create, status timer, ...).
            "passes_per_run": round(self.whole.passes / self.runs, 2),
            "cleanup_s": round(self.cleanup_s, 1),
            "operator_rss_mib": round(self.rss_mib, 1),
            **self.whole.figures(),
            # Passes the status interval asks for: one per run and interval.
            "steady": {
                **self.steady.figures(),
                "passes_vs_wanted": round(self.steady.passes / wanted, 3),
                "requests_per_run_per_min": round(
                    steady_requests / self.runs / (self.steady.seconds / 60), 2
                ),
            },
        }


def _call(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event['verb']} {resource}"


@dataclass(frozen=True)
class Timeline:
    """A phase's creates, by the API server's clock (its answers, from the audit log)."""

    created_at: float
    """The answer to the first RLRun's create: where every time of the phase starts."""
    latencies_s: list[float]
    """Per run, from the answer to its RLRun's create to the answer to the operator's create of
    its last child."""
    pods_created_s: float
    """From `created_at` to the answer to the create of the phase's last pod (by the StatefulSet
    and ReplicaSet controllers)."""


def timeline(
    events: list[dict[str, Any]], runs: dict[tuple[str, str], Expected], operator_user: str
) -> Timeline:
    """The phase's creates (answers 201; an operator's server-side apply that creates answers
    201 too)."""
    created: dict[tuple[str, str], float] = {}
    children: dict[tuple[str, str, str], float] = {}
    pods: list[float] = []
    namespaces = {namespace for namespace, _ in runs}
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or (event.get("responseStatus") or {}).get("code") != 201:
            continue
        key = (ref.get("namespace", ""), ref.get("name", ""))
        when = _time(event["stageTimestamp"])
        if ref.get("resource") == "rlruns" and event["verb"] == "create":
            created[key] = when
        elif ref.get("resource") == "pods" and not ref.get("subresource") and key[0] in namespaces:
            pods.append(when)
        elif event["user"]["username"] == operator_user and not ref.get("subresource"):
            children.setdefault((ref.get("resource", ""), *key), when)
    latencies = []
    for (namespace, name), want in runs.items():
        missing = [f"{r}/{n}" for r, n in sorted(want.children) if (r, namespace, n) not in children]
        if (namespace, name) not in created or missing:
            raise RuntimeError(f"{namespace}/{name}: no create of the RLRun or of {missing} in the audit log")
        done = max(children[(r, namespace, n)] for r, n in want.children)
        latencies.append(done - created[(namespace, name)])
    want_pods = sum(want.pods for want in runs.values())
    if len(pods) < want_pods:
        raise RuntimeError(f"{len(pods)} pod creates in the audit log, {want_pods} pods wanted")
    start = min(created.values())
    # The phase's pods are all Ready by now: the last of the first `want_pods` creates (a pod
    # the node controller or a drain replaced would come after).
    return Timeline(start, latencies, sorted(pods)[want_pods - 1] - start)


@dataclass
class Bench:
    cluster: Any
    operator: Operator
    audit: AuditLog
    watcher: Watcher
    sample: dict[str, Any]
    size: Size

    def phase(self, name: str, placements: list[tuple[str, str]]) -> Phase:
        manifests = [scale_run(self.sample, namespace, run) for namespace, run in placements]
        runs = {(m["metadata"]["namespace"], m["metadata"]["name"]): expected(m) for m in manifests}
        namespaces = {namespace for namespace, _ in placements}
        pods = sum(e.pods for e in runs.values())
        label = f"{name}: {len(runs)} runs, {pods} pods, {len(namespaces)} namespace(s)"
        stage(f"{label}: creating")
        self.audit.read()  # what came before the phase
        before = self.operator.usage()
        import yaml

        self.cluster.kubectl("create", "-f", "-", input=yaml.safe_dump_all(manifests))

        def right() -> tuple[bool, str]:
            ok, ready, why = self.watcher.wrong(runs)
            counted = f", {ready}/{pods} pods Ready" if ok == len(runs) else ""
            return not why, f"{ok}/{len(runs)} statuses right{counted}; waiting for {why}"

        right_at = wait(label, right, self.size.timeout_s, self.operator)
        after = self.operator.usage()
        events = self.audit.read()
        created = timeline(events, runs, self.operator.user)
        whole = self.window(before, after, events)
        stage(
            f"{label}: right after {right_at - created.created_at:.1f}s; "
            f"{STEADY_INTERVALS} status intervals of steady state"
        )
        time.sleep(STEADY_INTERVALS * self.size.status_interval_s)
        steady = self.window(after, self.operator.usage(), self.audit.read())
        stage(f"{label}: deleting")
        deleting = time.time()
        for namespace in sorted(namespaces):
            self.cluster.kubectl("delete", "rlrun", "--all", "-n", namespace, "--wait=false")

        def gone() -> tuple[bool, str]:
            left_runs, left_pods = self.watcher.gone(namespaces)
            return not (left_runs or left_pods), f"{left_runs} runs and {left_pods} pods left"

        gone_at = wait(f"{label}: deleting", gone, self.size.timeout_s, self.operator)
        return Phase(
            runs=len(runs),
            namespaces=len(namespaces),
            pods=pods,
            latencies_s=created.latencies_s,
            pods_created_s=created.pods_created_s,
            right_s=right_at - created.created_at,
            cleanup_s=gone_at - deleting,
            rss_mib=after.rss_kib / 1024,
            whole=whole,
            steady=steady,
            status_interval_s=self.size.status_interval_s,
        )

    def window(self, before: Usage, after: Usage, events: list[dict[str, Any]]) -> Window:
        # By audit ID: a watch has two events (its response started, and complete).
        mine = {e["auditID"]: e for e in events if e["user"]["username"] == self.operator.user}
        return Window(
            seconds=after.at - before.at,
            passes=sum((after.passes - before.passes).values()),
            requests_by_call=Counter(_call(e) for e in mine.values()),
            cpu_s=after.cpu_s - before.cpu_s,
        )


def _namespaces(size: Size) -> tuple[str, list[str]]:
    return "scale-one", [f"scale-{i:02d}" for i in range(size.namespaces)]


def start(kubecluster: ModuleType, root: Path, size: Size) -> tuple[Any, float]:
    pools = (
        kubecluster.NodePool(
            "cpu-node", count=size.cpu_nodes, labels={"node.kubernetes.io/instance-type": "n2-standard-64"}
        ),
        kubecluster.NodePool(
            "gpu-node",
            count=size.gpu_nodes,
            gpus=8,
            cpu="192",
            memory="2Ti",
            labels={"node.kubernetes.io/instance-type": "a3-highgpu-8g"},
        ),
    )
    started = time.monotonic()
    cluster = kubecluster.Cluster(kubecluster.ClusterOptions(pools=pools, kueue=False)).start()
    try:
        one, spread = _namespaces(size)
        for namespace in (one, *spread):
            cluster.kubectl("create", "namespace", namespace)
        cluster.helm(
            "install",
            RELEASE,
            str(root / CHART),
            "--namespace",
            OPERATOR_NAMESPACE,
            "--create-namespace",
            "--set-json",
            f"operator.runNamespaces={json.dumps([one, *spread])}",
            "--wait",
            "--timeout=120s",
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster, time.monotonic() - started


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def result_of(phases: dict[str, Phase], size: Size, start_s: float, peak_rss_kib: int) -> dict[str, Any]:
    base, one, spread = (phases[n].figures() for n in PHASES)
    ratios = {}
    figures = {
        "latency_p50_s": lambda p: p["latency_p50_s"],
        "latency_p99_s": lambda p: p["latency_p99_s"],
        "pods_created_s": lambda p: p["pods_created_s"],
        "right_s": lambda p: p["right_s"],
        "passes_per_run": lambda p: p["passes_per_run"],
        "requests_per_pass": lambda p: p["requests_per_pass"],
        "steady_requests_per_pass": lambda p: p["steady"]["requests_per_pass"],
        "steady_requests_per_run_per_min": lambda p: p["steady"]["requests_per_run_per_min"],
        "steady_cpu_ms_per_pass": lambda p: p["steady"]["cpu_ms_per_pass"],
        "steady_passes_vs_wanted": lambda p: p["steady"]["passes_vs_wanted"],
    }
    for key, figure in figures.items():
        ratios[f"{key}_{size.runs}_vs_1"] = _ratio(figure(one), figure(base))
        ratios[f"{key}_{size.namespaces}ns_vs_1ns"] = _ratio(figure(spread), figure(one))
    return {
        "benchmark": "operator-scale",
        "runs": size.runs,
        "namespaces": size.namespaces,
        "pods_per_run": INFERENCE_REPLICAS + ENV_SERVER_REPLICAS + 2,
        "nodes": {"cpu": size.cpu_nodes, "gpu": size.gpu_nodes},
        "status_interval_s": size.status_interval_s,
        "cluster_start_s": round(start_s, 1),
        "operator_peak_rss_mib": round(peak_rss_kib / 1024, 1),
        "phases": {"baseline": base, "one_namespace": one, "namespaces": spread},
        "ratios": ratios,
    }


PHASES = ("baseline", "one_namespace", "namespaces")
ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("runs / pods / namespaces", lambda p: f"{p['runs']} / {p['pods']} / {p['namespaces']}"),
    ("reconcile latency p50 (s)", lambda p: f"{p['latency_p50_s']:.3f}"),
    ("reconcile latency p99 (s)", lambda p: f"{p['latency_p99_s']:.3f}"),
    ("every pod created after (s)", lambda p: f"{p['pods_created_s']:.1f}"),
    ("reconcile passes per run", lambda p: f"{p['passes_per_run']:.2f}"),
    ("API requests per pass", lambda p: f"{p['requests_per_pass']:.1f}"),
    ("operator CPU per pass (ms)", lambda p: f"{p['cpu_ms_per_pass']:.1f}"),
    ("every status right after (s)", lambda p: f"{p['right_s']:.1f}"),
    ("steady: status passes / wanted", lambda p: f"{p['steady']['passes_vs_wanted']:.2f}"),
    ("steady: API requests per pass", lambda p: f"{p['steady']['requests_per_pass']:.1f}"),
    ("steady: requests per run per min", lambda p: f"{p['steady']['requests_per_run_per_min']:.1f}"),
    ("steady: CPU per pass (ms)", lambda p: f"{p['steady']['cpu_ms_per_pass']:.1f}"),
    ("steady: operator CPU (cores)", lambda p: f"{p['steady']['operator_cpu_cores']:.2f}"),
    ("operator RSS (MiB)", lambda p: f"{p['operator_rss_mib']:.0f}"),
    ("every run gone after (s)", lambda p: f"{p['cleanup_s']:.1f}"),
)


def table(result: dict[str, Any]) -> str:
    phases = result["phases"]
    lines = [f"{'':32}" + "".join(f"{n:>16}" for n in PHASES)]
    lines += [f"{label:32}" + "".join(f"{cell(phases[n]):>16}" for n in PHASES) for label, cell in ROWS]
    one = phases["one_namespace"]
    creating, steady = one["requests_per_pass_by_call"], one["steady"]["requests_per_pass_by_call"]
    lines += ["", f"requests per pass, by call (one namespace): {'whole phase':>12} {'steady':>8}"]
    for call in sorted(creating.keys() | steady.keys(), key=lambda c: -creating.get(c, 0)):
        lines.append(f"  {call:42} {creating.get(call, 0):12.2f} {steady.get(call, 0):8.2f}")
    lines.append("")
    lines += [f"{key}: {value}" for key, value in result["ratios"].items()]
    lines.append(f"operator peak RSS: {result['operator_peak_rss_mib']} MiB")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import dataclasses

    import yaml

    size = QUICK if args.quick else FULL
    size = dataclasses.replace(
        size, runs=args.runs or size.runs, namespaces=args.namespaces or size.namespaces
    )
    kubecluster = load_kubecluster(args.root)
    sample = yaml.safe_load((args.root / SAMPLE).read_text())
    stage(f"starting the control plane ({size.cpu_nodes} CPU and {size.gpu_nodes} GPU kwok nodes)")
    try:
        result = measure(kubecluster, args.root, sample, size)
    except (kubecluster.ClusterError, RuntimeError) as error:
        # A tool missing, a cluster that does not start, a run that never gets right: said
        # in one line (the cluster's logs went with it; RLRUN_KEEP_CLUSTER_DIR=1 keeps them).
        raise SystemExit(f"rlrun bench operator-scale: {error}") from error
    result["quick"] = args.quick
    print(table(result))
    return emit_result(result, args)


def measure(kubecluster: ModuleType, root: Path, sample: dict[str, Any], size: Size) -> dict[str, Any]:
    cluster, start_s = start(kubecluster, root, size)
    operator = None
    try:
        operator = Operator(kubecluster, cluster, size.status_interval_s)
        bench = Bench(
            cluster,
            operator,
            AuditLog(cluster.control_plane.audit_log),
            Watcher(cluster.api_client()),
            sample,
            size,
        )
        one, spread = _namespaces(size)
        phases = {
            "baseline": bench.phase("baseline", [(one, "base-0")]),
            "one_namespace": bench.phase("one_namespace", [(one, f"one-{i:03d}") for i in range(size.runs)]),
            "namespaces": bench.phase(
                "namespaces", [(spread[i % size.namespaces], f"spread-{i:03d}") for i in range(size.runs)]
            ),
        }
        peak = operator.usage().peak_rss_kib
    finally:
        if operator is not None:
            operator.process.stop()
        cluster.stop()
    return result_of(phases, size, start_s, peak)
