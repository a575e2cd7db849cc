"""The orchestrator's Prometheus metrics follow rlrun_<service>_<what>_<unit>."""

from __future__ import annotations

from prometheus_client import Counter
from prometheus_client.metrics import MetricWrapperBase

from rlrun.orchestrator import metrics


def test_every_metric_is_named_for_the_orchestrator_and_counters_end_in_total():
    found = {name: m for name, m in vars(metrics).items() if isinstance(m, MetricWrapperBase)}
    assert len(found) >= 20
    for attribute, metric in found.items():
        [family] = metric.describe()
        name = family.name + ("_total" if isinstance(metric, Counter) else "")
        assert name.startswith("rlrun_orchestrator_"), attribute
        assert name.endswith("_total") == isinstance(metric, Counter), attribute
        assert set(metric._labelnames) <= {"env", "filter", "reason"}, attribute
