"""The chart's dashboards and alert rules, and what their PromQL reads, found by parsing it
(promql-parser, the Rust Prometheus parser's Python binding), for the chart tests and the
observability integration tests."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlrun"
MONITORING_VALUES = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboards": {"enabled": True},
    }
}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def render(values: dict | None) -> list[dict]:
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="rlrun", namespace="rlrun-system", is_install=True)
    return [
        doc
        for name, text in sorted(rendered.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(objects: list[dict], kind: str) -> dict:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def dashboards(objects: list[dict] | None = None) -> dict[str, dict]:
    """The dashboards as the chart ships them (its ConfigMaps)."""
    objects = render(MONITORING_VALUES) if objects is None else objects
    return {
        name: json.loads(text)
        for cm in objects
        if cm["kind"] == "ConfigMap" and "grafana_dashboard" in cm["metadata"]["labels"]
        for name, text in cm["data"].items()
    }


def rule_spec(values: dict | None = None) -> dict:
    """The PrometheusRule's spec: a Prometheus rule file."""
    return one(render(values or MONITORING_VALUES), "PrometheusRule")["spec"]


def alert_rules(values: dict | None = None) -> list[dict]:
    return [r for group in rule_spec(values)["groups"] for r in group["rules"]]


@dataclass
class Query:
    where: str  # "<dashboard> / <panel title> / <refId>", "<dashboard> / $<variable>", "alert <name>"
    expr: str
    legend: str | None = None
    unit: str | None = None
    panel: bool = False


def grafana_to_promql(expr: str, namespace: str = "ns", run: str = ".*", rate_interval: str = "1m") -> str:
    """A dashboard query as Prometheus gets it from Grafana: its variables substituted."""
    return (
        expr.replace("$__rate_interval", rate_interval).replace("$namespace", namespace).replace("$run", run)
    )


LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def variable_selector(query: str) -> str:
    """The series selector of a `label_values(selector, label)` variable query."""
    match = LABEL_VALUES.match(query.strip())
    assert match, f"not a label_values() query: {query}"
    return match["selector"]


def queries(boards: dict[str, dict] | None = None, rules: list[dict] | None = None) -> list[Query]:
    """Every dashboard panel target, every dashboard variable's selector, every alert expr."""
    boards = dashboards() if boards is None else boards
    rules = alert_rules() if rules is None else rules
    out = []
    for name, board in boards.items():
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                out.append(
                    Query(f"{name} / ${variable['name']}", variable_selector(variable["query"]["query"]))
                )
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append(
                    Query(
                        f"{name} / {panel['title']} / {target['refId']}",
                        target["expr"],
                        target.get("legendFormat"),
                        panel["fieldConfig"]["defaults"].get("unit"),
                        panel=True,
                    )
                )
    for rule in rules:
        out.append(Query(f"alert {rule['alert']}", rule["expr"]))
    return out


def parse(expr: str):
    return promql_parser.parse(grafana_to_promql(expr))


def selectors(expr: str) -> list:
    """Every vector selector of the expression (the parsed AST's VectorSelector nodes)."""
    found = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(parse(expr), visit)
    return found


def selector_name(selector) -> str:
    if selector.name:
        return selector.name
    (name,) = [m.value for m in selector.matchers.matchers if m.name == "__name__"]
    return name


def metric_names(expr: str) -> set[str]:
    """The sample names the expression reads (`x_bucket` as written, not `x`)."""
    return {selector_name(s) for s in selectors(expr)}


def family(sample_name: str, families: set[str]) -> str:
    """The metric family of a sample name (`x_bucket` -> `x` when `x` is a histogram)."""
    for suffix in HISTOGRAM_SERIES:
        if sample_name.endswith(suffix) and sample_name.removesuffix(suffix) in families:
            return sample_name.removesuffix(suffix)
    return sample_name


def grouping(expr: str) -> set[str]:
    """The labels the result carries: those of the outermost `by (...)` aggregation (`le`
    aside, which histogram_quantile consumes)."""
    labels: list[set[str]] = []

    def visit(node):
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels.append(set(node.modifier.labels) - {"le"})
            return False  # the outermost one
        return None

    promql_parser.walk(parse(expr), visit)
    return labels[0] if labels else set()


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


# What a panel's unit must be, from the dimension of what its query computes: the metric's
# unit (its name's last word, DESIGN.md section 7), per second under rate(), the observed unit
# for a histogram's quantile or its _sum over its _count, a ratio for like over like.
def dimension(expr: str) -> str:
    def of(node) -> str:
        if isinstance(node, promql_parser.VectorSelector):
            name = selector_name(node)
            if name.endswith("_count"):
                return "events"  # a histogram's observations
            for suffix in HISTOGRAM_SERIES:
                name = name.removesuffix(suffix)
            name = name.removesuffix("_total")
            for unit in ("tokens_per_second", "seconds", "bytes"):
                if name.endswith(unit):
                    return {"tokens_per_second": "count/s"}.get(unit, unit)
            return "count"
        if isinstance(node, promql_parser.MatrixSelector):
            return of(node.vector_selector)
        if isinstance(node, promql_parser.Call):
            name = node.func.name
            args = [a for a in node.args if not isinstance(a, promql_parser.NumberLiteral)]
            inner = of(args[0])
            if name in ("rate", "irate"):
                return {"seconds": "seconds/s", "bytes": "bytes/s", "events": "events/s"}.get(
                    inner, "count/s"
                )
            if name == "histogram_quantile":
                return inner.removesuffix("/s")
            return inner
        if isinstance(node, promql_parser.AggregateExpr | promql_parser.ParenExpr):
            return of(node.expr)
        if isinstance(node, promql_parser.BinaryExpr):
            left, right = of(node.lhs), of(node.rhs)
            if str(node.op) == "/":
                if left == right:
                    return "ratio"
                if right == "events/s":
                    return left.removesuffix("/s")  # x_sum / x_count: the mean observation
                return f"{left}/{right}"
            return left
        raise AssertionError(f"no dimension for {type(node).__name__} in {expr}")

    return of(parse(expr))


UNITS = {
    # Grafana unit ids: https://grafana.com/docs/grafana/latest/panels-visualizations/configure-standard-options/
    "seconds": {"s"},
    "bytes": {"bytes", "decbytes"},
    "bytes/s": {"Bps", "binBps"},
    "seconds/s": {"percentunit"},  # CPU seconds per second: 1 = one core
    "count/s": {"cps", "ops", "reqps"},
    "ratio": {"percentunit"},
    "count": {"none", "short"},
}


def prometheus_binaries() -> tuple[str, str]:
    """promtool and prometheus: `make test`'s setup installs them (Debian's `prometheus`)."""
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and prometheus, (
        "promtool and prometheus are missing: run `make setup` (as root it installs Debian's "
        "`prometheus` package) or `apt-get install prometheus`"
    )
    return promtool, prometheus
