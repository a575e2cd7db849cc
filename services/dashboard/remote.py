"""A run seen through its orchestrator's status service (OrchestratorService.GetStatus): a
cluster run through `kubectl port-forward`, or any run whose folder is out of reach
(`rlrun dashboard --orchestrator HOST:PORT`).

The status carries the last trained step's metrics line (without its `phase`) and the last
eval reward, so the dashboard polls it and keeps, in memory, one line per step it saw and one
per new eval reward: the curves begin when the dashboard started watching. The resolved config
and the trace files live in the run folder only (`kubectl cp` it, and give the copy as a DIR).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import grpc

from rlrun.common.grpc_client import ClientOptions, open_channel
from rlrun.common.wire.orchestrator import RunStatus, status_from_proto, status_request
from rlrun.v1 import orchestrator_pb2_grpc

POLL_S = 1.0
LINE_PHASES = {"warmup": "warmup", "running": "rl", "stopping": "rl", "succeeded": "rl", "failed": "rl"}
"""The metrics line phase of the step a status of this run phase last reported."""


class RemoteRun:
    def __init__(self, address: str, options: ClientOptions):
        self.address = address
        self.options = options
        self.id = "orch-" + hashlib.sha256(address.encode()).hexdigest()[:8]
        self.rows: list[dict[str, Any]] = []
        self.status: RunStatus | None = None
        self.last_error: str | None = None
        self.updated = 0.0
        self._events: list[dict[str, Any]] = []

    def observe(self, status: RunStatus, now: float) -> None:
        """Takes in one answer of GetStatus: a line for a step not seen yet, and for an eval
        reward that changed."""
        if self.status is not None and status.resumes > self.status.resumes:
            self._events.append({"time": now, "event": "resume", "step": status.step, "trainer_step": None})
        self.status, self.updated, self.last_error = status, now, None
        phase = status.phase or "pending"
        metrics = dict(status.metrics)
        if "trainer_step" in metrics and phase in LINE_PHASES:
            trainer_step = int(metrics["trainer_step"])
            steps = [r for r in self.rows if r["phase"] in ("warmup", "rl")]
            if not steps or steps[-1]["trainer_step"] != trainer_step:
                line = {**metrics, "step": int(metrics.get("step", 0)), "trainer_step": trainer_step}
                self.rows.append({**line, "phase": LINE_PHASES[phase], "time": now})
        evals = [r for r in self.rows if r["phase"] == "eval"]
        if status.eval_reward and (not evals or evals[-1]["eval_reward"] != status.eval_reward):
            self.rows.append(
                {"phase": "eval", "step": status.step, "eval_reward": status.eval_reward, "time": now}
            )

    async def watch(self) -> None:
        """Polls until cancelled; an orchestrator that does not answer is shown as such."""
        async with open_channel(self.address, self.options) as channel:
            stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
            while True:
                try:
                    reply = await stub.GetStatus(status_request(), timeout=10.0)
                except grpc.aio.AioRpcError as error:
                    self.last_error = f"{self.address}: {error.code().name}: {error.details()}"
                else:
                    self.observe(status_from_proto(reply), time.time())
                await asyncio.sleep(POLL_S)

    # -- what the app asks of a run (as of runs.RunFolder) ----------------------------------------

    def info(self) -> dict[str, Any]:
        st = self.status
        rl = [r for r in self.rows if r["phase"] == "rl"]
        warm = [r for r in self.rows if r["phase"] == "warmup"]
        phase = (st.phase or "pending") if st is not None else "unreachable"
        return {
            "id": self.id,
            "name": f"orchestrator {self.address}",
            "path": f"grpc://{self.address} (status service)",
            "phase": phase,
            "live": st is not None and self.last_error is None and phase not in ("succeeded", "failed"),
            "step": st.step if st is not None else 0,
            "max_steps": st.max_steps if st is not None else None,
            "warmup_steps": int(warm[-1]["step"]) if warm else 0,
            "policy_version": st.version if st is not None else None,
            "train_reward": rl[-1].get("reward_mean") if rl else None,
            "eval_reward": st.eval_reward if st is not None and st.eval_reward else None,
            "updated": self.updated,
        }

    def config(self) -> None:
        return None

    def summary(self) -> None:
        return None

    def error(self) -> str | None:
        if self.last_error is not None:
            return f"the status service does not answer: {self.last_error}"
        return self.status.last_error if self.status is not None and self.status.last_error else None

    def metrics(self) -> list[dict[str, Any]]:
        return list(self.rows)

    def events(self) -> list[dict[str, Any]]:
        """The resumes it saw (the status counts them)."""
        return list(self._events)

    def trace_steps(self) -> list[dict[str, Any]]:
        return []

    def trace_groups(self, phase: str, step: int) -> None:
        return None
