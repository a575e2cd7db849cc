"""The operator's own Prometheus metrics, served on `rlrun operator --metrics-port`:

- `rlrun_operator_reconciles_total{handler}`: sync passes, by kopf handler (`reconcile` on
  create/update/resume, `status` on the timer, `cleanup` on delete);
- `rlrun_operator_reconcile_errors_total{handler,reason}`: passes that hit a problem, by
  reason: `api` (the API server did not answer; kopf retries), `apply` (an object was refused,
  e.g. an immutable field), `invalid_spec` (the RLRun cannot be reconciled), `unexpected`;
- `rlrun_operator_reconcile_duration_seconds{handler}`: how long a pass took;
- `rlrun_operator_run_phase{namespace,run,phase}`: 1 for the phase each run is in, 0 for the
  others (kube-state-metrics style, so `sum by (phase)` counts runs per phase).

Each `OperatorMetrics` has its own registry, so tests can run several operators in a process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rlrun.common.metrics import metric_name
from rlrun.operator.spec import PHASES

ERROR_REASONS = ("api", "apply", "invalid_spec", "unexpected")


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            metric_name("operator", "reconciles", "total"),
            "Reconcile passes, by kopf handler.",
            ["handler"],
            registry=self.registry,
        )
        self.errors = Counter(
            metric_name("operator", "reconcile_errors", "total"),
            "Reconcile passes that hit a problem, by handler and reason.",
            ["handler", "reason"],
            registry=self.registry,
        )
        self.duration = Histogram(
            metric_name("operator", "reconcile_duration", "seconds"),
            "Duration of a reconcile pass.",
            ["handler"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.phase = Gauge(
            metric_name("operator", "run", "phase"),
            "1 for the phase each RLRun is in, 0 for the other phases.",
            ["namespace", "run", "phase"],
            registry=self.registry,
        )
        for handler in ("reconcile", "status", "cleanup"):
            self.reconciles.labels(handler)
            self.duration.labels(handler)
            for reason in ERROR_REASONS:
                self.errors.labels(handler, reason)

    @contextmanager
    def timed(self, handler: str) -> Iterator[None]:
        """Counts and times one pass; an exception escaping it counts as an error (`api` for
        kopf's TemporaryError, which the handlers raise when the API server fails)."""
        import kopf

        started = time.perf_counter()
        self.reconciles.labels(handler).inc()
        try:
            yield
        except kopf.TemporaryError:
            self.errors.labels(handler, "api").inc()
            raise
        except Exception:
            self.errors.labels(handler, "unexpected").inc()
            raise
        finally:
            self.duration.labels(handler).observe(time.perf_counter() - started)

    def error(self, handler: str, reason: str) -> None:
        self.errors.labels(handler, reason).inc()

    def set_phase(self, namespace: str, run: str, phase: str | None) -> None:
        for each in PHASES:
            self.phase.labels(namespace, run, each).set(1 if each == phase else 0)

    def forget(self, namespace: str, run: str) -> None:
        """Drops a deleted run's series (they would otherwise stay at their last value)."""
        for each in PHASES:
            try:
                self.phase.remove(namespace, run, each)
            except KeyError:
                pass
