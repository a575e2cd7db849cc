"""One pod on the node, from binding to deletion, as kubelet's pod worker runs it: the sandbox
(network namespace and address), the volumes, the init containers in order, then the
containers, restarted per restartPolicy with kubelet's back-off (CrashLoopBackOff), probed, and
reported through the pods/status subresource (phase, conditions, container statuses). A
deletionTimestamp stops the containers (SIGTERM to each container's PID 1, SIGKILL after the grace
period), and the pod object is then deleted with gracePeriodSeconds=0, as kubelet does."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import events
from .env import ConfigError, container_env, expand
from .images import Image, ImageError, resolve
from .kube import ApiError
from .network import attach, wait_detached
from .probes import LIVENESS, READINESS, STARTUP, Prober, check
from .runtime import Launch, Run, Sandbox, now_iso
from .volumes import WRITER_SOURCES, PodVolumes, VolumeError

if TYPE_CHECKING:
    from .kubelet import Agent

log = logging.getLogger("kubecluster.agent")

MIN_GRACE_S = 2
"""kubelet's floor for a deletion's grace period (a force deletion still gets it)."""


@dataclass
class Container:
    """A container of the pod across its restarts."""

    spec: dict[str, Any]
    init: bool
    attempts: int = 0
    run: Run | None = None
    """The running start, None once it exited."""
    terminated: dict[str, Any] | None = None
    """The state of the last start once it exited (lastState while the next one runs or waits)."""
    previous: dict[str, Any] | None = None
    """The state of the start before the current one."""
    finished_ts: float = 0.0
    waiting: tuple[str, str] = ("ContainerCreating", "")
    done: bool = False
    """Exited and not to be restarted."""
    backoff_s: float = 0.0
    backoff_updated: float | None = None
    probers: dict[str, Prober] = field(default_factory=dict)
    probing_after_startup: bool = False
    image_id: str = ""
    container_id: str = ""

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def restarts(self) -> int:
        return max(self.attempts - 1, 0)

    @property
    def running(self) -> bool:
        return self.run is not None and self.run.exit_code() is None

    @property
    def started(self) -> bool:
        if not self.running:
            return False
        startup = self.probers.get(STARTUP)
        return startup is None or startup.result

    @property
    def ready(self) -> bool:
        if not self.started:
            return False
        readiness = self.probers.get(READINESS)
        return readiness is None or readiness.result

    def stop_probers(self) -> None:
        for prober in self.probers.values():
            prober.stop()
        self.probers.clear()
        self.probing_after_startup = False


class PodWorker:
    def __init__(self, agent: Agent, pod: dict[str, Any]):
        meta = pod["metadata"]
        self.name = f"pod {meta['namespace']}/{meta['name']}"
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self.agent = agent
        self.pod = pod
        self.uid = meta["uid"]
        self.folder = agent.folder / "pods" / self.uid
        self.log_folder = agent.folder / "logs" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        self.wake = threading.Event()
        self.removed = False
        self.shutdown_grace: float | None = None
        self.sandbox: Sandbox | None = None
        self.address: str | None = None
        self.veth: str | None = None
        self.volumes = PodVolumes(
            pod, self.folder / "volumes", agent.get_or_none, self._request_token, agent.allocatable
        )
        self.setup_error: str | None = None
        self.volumes_refreshed = 0.0
        self.start_time = now_iso()
        self.containers = [Container(c, True) for c in pod["spec"].get("initContainers") or []]
        self.containers += [Container(c, False) for c in pod["spec"]["containers"]]
        self.terminal = False
        self.last_status: str | None = None
        self.transitions: dict[str, tuple[str, str]] = {}
        self.images: dict[str, Image] = {}

    # --- the watch's side

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.volumes.pod = pod
        self.wake.set()

    def remove(self) -> None:
        self.removed = True
        self.wake.set()

    def shutdown(self, grace_s: float) -> None:
        self.shutdown_grace = grace_s
        self.wake.set()

    def log_file(self, name: str, previous: bool) -> tuple[Path, Callable[[], bool]] | None:
        """A container's log (the current start's, or the one before) and whether it still grows."""
        container = next((c for c in self.containers if c.name == name), None)
        if container is None or not container.attempts:
            return None
        attempt = container.restarts - (1 if previous else 0)
        if attempt < 0:
            return None
        return (
            self.log_folder / name / f"{attempt}.log",
            lambda: not previous and container.running and container.restarts == attempt,
        )

    def _event(self, reason: str, message: str, warning: bool = False, container: str | None = None) -> None:
        events.record(self.agent.kube, self.agent.config.node, self.pod, reason, message, warning, container)

    # --- the loop

    def run(self) -> None:
        try:
            if (self.pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self.terminal = True  # finished before this agent started: kubelet does not rerun it
            while True:
                if self.shutdown_grace is not None:
                    self._terminate(self.shutdown_grace, delete=False)
                    return
                if self.removed or self.pod["metadata"].get("deletionTimestamp"):
                    self._terminate(self._grace(), delete=not self.removed)
                    return
                if not self.terminal:
                    self._sync()
                    self._publish()
                self.wake.wait(1.0)
                self.wake.clear()
        except Exception:
            log.exception("%s failed", self.name)
            self._terminate(MIN_GRACE_S, delete=False)
        finally:
            self.agent.forget(self.uid)

    def _grace(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        return max(float(grace), MIN_GRACE_S)

    def _sync(self) -> None:
        if self.sandbox is None and not self._start_sandbox():
            return
        if not self._setup_volumes():
            return
        for container in self.containers:
            if not container.init:
                continue
            self._sync_container(container)
            if container.done and container.terminated and container.terminated["exitCode"] != 0:
                self._finish()  # a failed init container under restartPolicy Never
                return
            if not container.done:
                return  # the next init container waits for this one
        mains = [c for c in self.containers if not c.init]
        for container in mains:
            self._sync_container(container)
        if all(c.done for c in mains):
            self._finish()

    def _finish(self) -> None:
        """The pod reached Succeeded or Failed: its sandbox goes, its status stays."""
        self.terminal = True
        for container in self.containers:
            container.stop_probers()
        self._publish()
        self._stop_sandbox()

    # --- sandbox and volumes

    def _start_sandbox(self) -> bool:
        spec = self.pod["spec"]
        host_network = bool(spec.get("hostNetwork"))
        try:
            self.sandbox = Sandbox(self.hostname, host_network)
            if host_network:
                self.address = self.agent.node_ip
            else:
                self.address = self.agent.addresses.take()
                self.veth = attach(self.agent.bridge, self.sandbox.pid, self.address)
        except Exception as error:  # noqa: BLE001 - reported on the pod, retried
            self._stop_sandbox()
            self.setup_error = f"failed to create the pod sandbox: {error}"
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write_etc_files()
        return True

    def _stop_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.stop()
            self.sandbox = None
        if self.veth is not None:
            wait_detached(self.veth)
            self.veth = None
        if self.address is not None and self.address != self.agent.node_ip:
            self.agent.addresses.give_back(self.address)
        self.address = None

    @property
    def hostname(self) -> str:
        spec = self.pod["spec"]
        return (spec.get("hostname") or self.pod["metadata"]["name"])[:63]

    @property
    def fqdn(self) -> str | None:
        subdomain = self.pod["spec"].get("subdomain")
        if not subdomain:
            return None
        return f"{self.hostname}.{subdomain}.{self.pod['metadata']['namespace']}.svc.{self.agent.config.cluster_domain}"

    def _write_etc_files(self) -> None:
        """/etc/hosts, /etc/hostname and /etc/resolv.conf of the pod, as kubelet writes them."""
        names = f"{self.fqdn}\t{self.hostname}" if self.fqdn else self.hostname
        hosts = [
            "# Kubernetes-managed hosts file.",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{self.address}\t{names}",
        ]
        for alias in self.pod["spec"].get("hostAliases") or []:
            hosts.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames') or [])}")
        (self.folder / "hosts").write_text("\n".join(hosts) + "\n")
        (self.folder / "hostname").write_text(self.hostname + "\n")
        (self.folder / "resolv.conf").write_text(self._resolv_conf())

    def _resolv_conf(self) -> str:
        spec = self.pod["spec"]
        namespace = self.pod["metadata"]["namespace"]
        domain = self.agent.config.cluster_domain
        policy = spec.get("dnsPolicy") or "ClusterFirst"
        if policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and not spec.get("hostNetwork")):
            servers = [self.agent.config.dns]
            searches = [f"{namespace}.svc.{domain}", f"svc.{domain}", domain]
            options = ["ndots:5"]
        elif policy == "None":
            servers, searches, options = [], [], []
        else:  # Default, or ClusterFirst on the host network: the node's own resolver
            return Path("/etc/resolv.conf").read_text()
        config = spec.get("dnsConfig") or {}
        servers += config.get("nameservers") or []
        searches += config.get("searches") or []
        for option in config.get("options") or []:
            options.append(f"{option['name']}:{option['value']}" if option.get("value") else option["name"])
        lines = [f"search {' '.join(searches)}"] if searches else []
        lines += [f"nameserver {server}" for server in servers]
        if options:
            lines.append(f"options {' '.join(options)}")
        return "\n".join(lines) + "\n"

    def _setup_volumes(self) -> bool:
        try:
            self.volumes.setup()
            if time.monotonic() - self.volumes_refreshed > self.agent.config.volume_refresh_s:
                self.volumes.refresh()
                self.volumes_refreshed = time.monotonic()
        except (VolumeError, ApiError) as error:
            message = f"MountVolume.SetUp failed: {error}"
            if message != self.setup_error:
                self._event("FailedMount", message, warning=True)
            self.setup_error = message
            return False
        self.setup_error = None
        return True

    def _request_token(self, account: str, spec: dict[str, Any]) -> dict[str, Any]:
        namespace = self.pod["metadata"]["namespace"]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        return self.agent.kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body)

    # --- containers

    def _sync_container(self, container: Container) -> None:
        if container.done:
            return
        if container.run is not None:
            code = container.run.exit_code()
            if code is None:
                self._probe(container)
                return
            self._exited(container, code)
            if container.done:
                return
        if container.terminated is not None and self._in_backoff(container, time.time()):
            return
        self._start(container)

    def _in_backoff(self, container: Container, now: float) -> bool:
        """kubelet's restart back-off: the first restart is at once, then after 10s, 20s, 40s ...
        up to 5 minutes; a container that ran longer than twice the cap starts over."""
        config = self.agent.config
        finished = container.finished_ts
        if (
            container.backoff_updated is not None
            and finished - container.backoff_updated > 2 * config.max_backoff_s
        ):
            container.backoff_s = 0.0
        if container.backoff_s and now - finished < container.backoff_s:
            meta = self.pod["metadata"]
            if container.waiting[0] != "CrashLoopBackOff":
                self._event(
                    "BackOff", f"Back-off restarting failed container {container.name}", True, container.name
                )
            container.waiting = (
                "CrashLoopBackOff",
                f"back-off {container.backoff_s:g}s restarting failed container={container.name} "
                f"pod={meta['name']}_{meta['namespace']}({self.uid})",
            )
            return True
        container.backoff_s = (
            min(container.backoff_s * 2, config.max_backoff_s) if container.backoff_s else config.backoff_s
        )
        container.backoff_updated = now
        return False

    def _exited(self, container: Container, code: int) -> None:
        run = container.run
        assert run is not None
        container.run = None
        container.stop_probers()
        reason = "StartError" if run.start_error else ("Completed" if code == 0 else "Error")
        container.terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": run.started_at,
            "finishedAt": run.finished_at or now_iso(),
            "containerID": container.container_id,
        }
        if run.start_error:
            container.terminated["message"] = run.start_error
        container.finished_ts = time.time()
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if container.init:
            container.done = code == 0 or policy == "Never"
        else:
            container.done = not (policy == "Always" or (policy == "OnFailure" and code != 0))
        meta = self.pod["metadata"]
        log.info("%s/%s: %s exited with %d", meta["namespace"], meta["name"], container.name, code)

    def _start(self, container: Container) -> None:
        try:
            launch, image = self._launch(container)
        except (ImageError, ConfigError) as error:
            reason = "ErrImagePull" if isinstance(error, ImageError) else "CreateContainerConfigError"
            if container.waiting != (reason, str(error)):
                self._event("Failed", f"Error: {error}", True, container.name)
            container.waiting = (reason, str(error))
            return
        container.attempts += 1
        attempt = container.restarts
        meta = self.pod["metadata"]
        container.container_id = f"rlrun-agent://{self.uid[:8]}-{container.name}-{attempt}"
        container.image_id = f"rlrun-agent://Dockerfiles/{image.dockerfile.name}"
        run_folder = self.folder / "containers" / f"{container.name}-{attempt}"
        shutil.rmtree(run_folder, ignore_errors=True)
        log_path = self.log_folder / container.name / f"{attempt}.log"
        assert self.sandbox is not None
        container.previous, container.terminated = container.terminated, None
        container.run = Run(self.sandbox, launch, run_folder, log_path, self.agent.config.python)
        container.waiting = ("ContainerCreating", "")
        if container.run.start_error:
            self._event("Failed", f"Error: {container.run.start_error}", True, container.name)
        else:
            self._event("Started", f"Started container {container.name}", container=container.name)
        log.info("%s/%s: started %s (restart %d)", meta["namespace"], meta["name"], container.name, attempt)
        if "startupProbe" in container.spec:
            self._start_probers(container, (STARTUP,))

    def _launch(self, container: Container) -> tuple[Launch, Image]:
        spec = container.spec
        if container.init and spec.get("restartPolicy") == "Always":
            raise ConfigError(
                "restartable init containers (sidecars) are not supported by the test node agent"
            )
        image = self.images.get(spec["image"]) or resolve(spec["image"], self.agent.repo)
        self.images[spec["image"]] = image
        env = dict(image.env)
        env["PATH"] = f"{self.agent.venv / 'bin'}:{env.get('PATH', '')}"
        env["HOSTNAME"] = self.hostname
        env |= container_env(
            self._pod_view(), spec, self.agent.service_env, self._lookup, self.agent.allocatable
        )
        command = spec.get("command") or image.entrypoint
        args = spec.get("args") if "args" in spec else (image.cmd if not spec.get("command") else [])
        argv = [expand(word, env) for word in [*command, *(args or [])]]
        if not argv:
            raise ConfigError(f"container {container.name}: neither the pod nor the image gives a command")
        uid, gid, groups = self._identity(spec, image)
        env.setdefault("HOME", image.home(uid))
        security = spec.get("securityContext") or {}
        launch = Launch(
            argv=argv,
            env=env,
            workdir=spec.get("workingDir") or image.workdir,
            mounts=self._mounts(spec, image),
            uid=uid,
            gid=gid,
            groups=groups,
            read_only_root=bool(security.get("readOnlyRootFilesystem")),
            no_new_privileges=security.get("allowPrivilegeEscalation") is False,
            traverse=self.agent.traverse,
            users=[
                {**dataclasses.asdict(user), "passwd": user.passwd(), "group": user.group()}
                for user in image.users
            ],
        )
        return launch, image

    def _pod_view(self) -> dict[str, Any]:
        """The pod with the addresses this worker knows before the API has them (kubelet sets
        status.podIP before the containers start, and their env may refer to it)."""
        status = dict(self.pod.get("status") or {})
        status |= {"hostIP": self.agent.node_ip, "hostIPs": [{"ip": self.agent.node_ip}]}
        if self.address is not None:
            status |= {"podIP": self.address, "podIPs": [{"ip": self.address}]}
        return {**self.pod, "status": status}

    def _identity(self, spec: dict[str, Any], image: Image) -> tuple[int, int, list[int]]:
        """The user and groups: the container's securityContext over the pod's over the image's
        USER. The venv's interpreter works for any user (rootfs.py opens the way to it), so the
        pod's runAsUser is honoured as on a real node."""
        pod_security = self.pod["spec"].get("securityContext") or {}
        security = spec.get("securityContext") or {}
        image_uid, image_gid = image.uid_gid()
        uid = security.get("runAsUser", pod_security.get("runAsUser", image_uid))
        gid = security.get("runAsGroup", pod_security.get("runAsGroup", image_gid))
        if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) and uid == 0:
            raise ConfigError("container has runAsNonRoot and image will run as root")
        groups = [gid]
        if pod_security.get("fsGroup") is not None:
            groups.append(pod_security["fsGroup"])
        groups += pod_security.get("supplementalGroups") or []
        return uid, gid, sorted(set(groups))

    def _mounts(self, spec: dict[str, Any], image: Image) -> list[dict[str, Any]]:
        mounts = [
            {"source": str(self.agent.repo / source), "target": target, "readOnly": True}
            for source, target in image.copies
        ]
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        own = []
        for mount in spec.get("volumeMounts") or []:
            source = self.volumes.paths[mount["name"]]
            volume = volumes[mount["name"]]
            if mount.get("subPath"):
                source = _sub_path(source, mount["subPath"])
            read_only = (
                bool(mount.get("readOnly"))
                or self.volumes.read_only.get(mount["name"], False)
                or any(kind in volume for kind in WRITER_SOURCES)  # kubelet mounts these read-only
            )
            own.append({"source": str(source), "target": mount["mountPath"], "readOnly": read_only})
        # Parents before children, as runtimes sort mounts.
        mounts += sorted(own, key=lambda m: m["target"].rstrip("/").count("/"))
        for name in ("hosts", "hostname", "resolv.conf"):
            mounts.append({"source": str(self.folder / name), "target": f"/etc/{name}", "readOnly": False})
        return mounts

    def _lookup(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.agent.get_or_none(f"/api/v1/namespaces/{self.pod['metadata']['namespace']}/{kind}/{name}")

    # --- probes

    def _start_probers(self, container: Container, kinds: tuple[str, ...]) -> None:
        run = container.run
        assert run is not None
        for kind in kinds:
            probe = container.spec[f"{kind}Probe"]
            target = functools.partial(check, probe, self.address or "", container.spec, run.exec)
            prober = Prober(kind, probe, target, self.wake.set, f"{self.name} {container.name} {kind}")
            container.probers[kind] = prober
            prober.start()

    def _probe(self, container: Container) -> None:
        if container.init:
            return
        if container.started and not container.probing_after_startup:
            container.probing_after_startup = True
            self._start_probers(
                container, tuple(k for k in (READINESS, LIVENESS) if f"{k}Probe" in container.spec)
            )
        failed = next((p for p in container.probers.values() if p.failed), None)
        if failed is None:
            return
        log.info(
            "%s: %s failed its %s probe (%s); restarting it",
            self.name,
            container.name,
            failed.kind,
            failed.message,
        )
        self._event(
            "Unhealthy", f"{failed.kind.capitalize()} probe failed: {failed.message}", True, container.name
        )
        self._event(
            "Killing",
            f"Container {container.name} failed {failed.kind} probe, will be restarted",
            container=container.name,
        )
        container.stop_probers()
        grace = failed.probe.get("terminationGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        assert container.run is not None
        container.run.stop(float(grace))

    # --- status

    def _publish(self) -> None:
        status = self._status()
        key = json.dumps(status, sort_keys=True)
        if key == self.last_status:
            return
        meta = self.pod["metadata"]
        try:
            self.agent.kube.merge_patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", {"status": status}
            )
        except ApiError as error:
            if error.status != 404:
                log.warning("%s: status update failed: %s", self.name, error)
            return
        self.last_status = key

    def _status(self) -> dict[str, Any]:
        inits = [self._container_status(c) for c in self.containers if c.init]
        mains = [self._container_status(c) for c in self.containers if not c.init]
        phase = pod_phase(self.pod["spec"], inits, mains, self.terminal)
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": self.agent.node_ip,
            "hostIPs": [{"ip": self.agent.node_ip}],
            "startTime": self.start_time,
            "conditions": self._conditions(phase, inits, mains),
            "containerStatuses": mains,
        }
        if inits:
            status["initContainerStatuses"] = inits
        if self.address is not None:
            status["podIP"] = self.address
            status["podIPs"] = [{"ip": self.address}]
        if self.setup_error and phase == "Pending":
            status["message"] = self.setup_error
        return status

    def _container_status(self, container: Container) -> dict[str, Any]:
        state: dict[str, Any]
        last = container.previous
        if container.run is not None:
            state = {"running": {"startedAt": container.run.started_at}}
        elif container.done and container.terminated is not None:
            state = {"terminated": container.terminated}
        else:
            reason, message = container.waiting
            if reason == "ContainerCreating" and self.setup_error:
                message = self.setup_error
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
            last = container.terminated
        status: dict[str, Any] = {
            "name": container.name,
            "image": container.spec["image"],
            "imageID": container.image_id,
            "ready": container.ready,
            "started": container.started,
            "restartCount": container.restarts,
            "state": state,
            "lastState": {"terminated": last} if last is not None else {},
        }
        if container.container_id:
            status["containerID"] = container.container_id
        return status

    def _conditions(self, phase: str, inits: list[dict], mains: list[dict]) -> list[dict[str, Any]]:
        completed = phase in ("Succeeded", "Failed")
        incomplete = [s["name"] for s in inits if s["state"].get("terminated", {}).get("exitCode") != 0]
        unready = [s["name"] for s in mains if not s["ready"]]
        gates = [g["conditionType"] for g in self.pod["spec"].get("readinessGates") or []]
        current = {c["type"]: c for c in (self.pod.get("status") or {}).get("conditions") or []}
        gates_ok = all(current.get(gate, {}).get("status") == "True" for gate in gates)

        def condition(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
            value = "True" if ok else "False"
            previous = self.transitions.get(kind)
            if previous is None or previous[0] != value:
                self.transitions[kind] = (value, now_iso())
            out = {
                "type": kind,
                "status": value,
                "lastProbeTime": None,
                "lastTransitionTime": self.transitions[kind][1],
            }
            if not ok and reason:
                out |= {"reason": reason, "message": message}
            return out

        not_ready = (
            ("PodCompleted", "")
            if completed
            else (
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(unready)}]",
            )
        )
        ours = [
            condition("PodReadyToStartContainers", self.sandbox is not None),
            condition(
                "Initialized",
                not incomplete,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(incomplete)}]",
            ),
            condition("ContainersReady", not unready and not completed, *not_ready),
            condition("Ready", not unready and not completed and gates_ok, *not_ready),
        ]
        mine = {c["type"] for c in ours}
        return [c for t, c in current.items() if t not in mine] + ours

    # --- the end

    def _terminate(self, grace_s: float, delete: bool) -> None:
        for container in self.containers:
            container.stop_probers()
        runs = [c.run for c in self.containers if c.run is not None]
        if delete:
            for container in self.containers:
                if container.run is not None:
                    self._event("Killing", f"Stopping container {container.name}", container=container.name)
        stoppers = [threading.Thread(target=run.stop, args=(grace_s,)) for run in runs]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        for container in self.containers:
            if container.run is not None:
                self._exited(container, container.run.exit_code() or 0)
            if container.terminated is not None:
                container.done = True
        self._stop_sandbox()
        if delete:
            self.terminal = True
            self._publish()
            self._delete_pod()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _delete_pod(self) -> None:
        meta = self.pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            self.agent.kube.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)
        except ApiError as error:
            if error.status not in (404, 409):
                raise


def _sub_path(volume: Path, sub_path: str) -> Path:
    parts = Path(sub_path).parts
    if Path(sub_path).is_absolute() or ".." in parts:
        raise ConfigError(f"subPath {sub_path!r} must be a relative path inside the volume")
    path = volume.joinpath(*parts)
    resolved = path.resolve()
    if not resolved.is_relative_to(volume.resolve()) and not path.is_symlink():
        raise ConfigError(f"subPath {sub_path!r} leaves the volume")
    if not path.exists():
        path.mkdir(parents=True)
    return resolved


def _count_inits(inits: list[dict]) -> tuple[int, int]:
    """(pending, failed) init containers."""
    pending = failed = 0
    for status in inits:
        state, last = status["state"], status["lastState"]
        if "terminated" in state:
            failed += state["terminated"]["exitCode"] != 0
        elif "terminated" in last and "running" not in state:
            failed += last["terminated"]["exitCode"] != 0
        else:
            pending += 1
    return pending, failed


def _count_containers(mains: list[dict]) -> tuple[int, int, int, int]:
    """(running, waiting, stopped, succeeded) containers."""
    running = waiting = stopped = succeeded = 0
    for status in mains:
        state, last = status["state"], status["lastState"]
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"]["exitCode"] == 0
        elif "terminated" in last:
            stopped += 1
        else:
            waiting += 1
    return running, waiting, stopped, succeeded


def pod_phase(spec: dict[str, Any], inits: list[dict], mains: list[dict], terminal: bool) -> str:
    """kubelet's getPhase, for the statuses this agent reports."""
    restart = spec.get("restartPolicy", "Always")
    pending_init, failed_init = _count_inits(inits)
    running, waiting, stopped, succeeded = _count_containers(mains)
    if failed_init and restart == "Never":
        return "Failed"
    if pending_init or waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if terminal or restart != "Always":
            if stopped == succeeded:
                return "Succeeded"
            if terminal or restart == "Never":
                return "Failed"
        return "Running"
    return "Pending"
