"""The Grafana dashboard and the Prometheus alerts: valid files, rules that `promtool` accepts and
whose unit tests pass, and every metric they name declared in shared/metrics.py with the labels they use."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from shared import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "palace.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"

# Series Prometheus makes itself, not a service: `up` per scrape target.
SYNTHETIC = {"up": {"job", "instance", "service"}}
# Labels the scrape adds to every series (prometheus.yml: job, instance; the target's `service`).
TARGET_LABELS = {"job", "instance", "service"}

def _family_samples(name: str, kind: str) -> list[str]:
    """The sample names a metric family exposes (prometheus_client strips `_total` from counter names)."""
    if kind == "counter":
        return [name.removesuffix("_total") + "_total"]
    if kind == "histogram":
        return [f"{name}_bucket", f"{name}_sum", f"{name}_count"]
    if kind == "summary":
        return [name, f"{name}_sum", f"{name}_count"]
    return [name]


def _declared() -> dict[str, set[str]]:
    """Sample name -> its labels, for every metric shared/metrics.py declares."""
    out: dict[str, set[str]] = {}
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            labels = set(obj._labelnames)
            for sample in _family_samples(obj._name, obj._type):
                out[sample] = labels | ({"le"} if sample.endswith("_bucket") else set())
    return out


def _known() -> dict[str, set[str]]:
    known = dict(SYNTHETIC)
    known.update(_declared())
    return known


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append(target["expr"])
    return out


def _alert_exprs() -> list[str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


# A metric selector: a name not preceded by an identifier character, then optional {matchers}.
_SELECTOR = re.compile(r"(?<![\w:.$\"])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
_NOT_METRICS = {
    # PromQL functions, aggregations and keywords the expressions use.
    "sum", "max", "min", "avg", "count", "rate", "increase", "deriv", "irate", "histogram_quantile",
    "clamp_min", "clamp_max", "absent", "by", "without", "and", "or", "unless", "on", "ignoring",
    "group_left", "group_right", "offset", "bool", "time", "vector", "scalar", "abs", "topk", "bottomk",
}


def _selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names in its matchers) for each metric an expression reads."""
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors, [5m] / [$__rate_interval]
    expr = re.sub(r"(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping label lists
    expr = re.sub(r"\$__\w+", "", expr)
    found = []
    for m in _SELECTOR.finditer(expr):
        name, matchers = m.group(1), m.group(2) or ""
        if name in _NOT_METRICS or re.fullmatch(r"\d.*|[eE]", name):
            continue
        # A function call, not a metric: its name is followed by "(".
        if expr[m.end(1):].lstrip().startswith("(") and not matchers:
            continue
        found.append((name, set(_MATCHER.findall(matchers))))
    return found


def test_dashboard_is_valid_grafana_json_with_the_panels_operators_need() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", "panels use the datasource variable, not a fixed uid"
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
    text = json.dumps(dash)
    for metric in ("palace_messages_processed_total", "palace_handler_seconds_bucket",
                   "palace_consumer_pending_messages", "palace_consumer_oldest_unacked_age_seconds",
                   "palace_messages_dead_lettered_total", "palace_search_seconds_bucket",
                   "palace_http_requests_total", "palace_embedded_texts_total", "palace_embed_seconds_bucket"):
        assert metric in text, f"the dashboard has no panel on {metric}"
    assert "histogram_quantile(0.5," in text and "histogram_quantile(0.99," in text


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_named_is_declared_with_the_labels_used(source: str) -> None:
    exprs = _dashboard_exprs() if source == "dashboard" else _alert_exprs()
    known = _known()
    seen = set()
    for expr in exprs:
        for name, labels in _selectors(expr):
            assert name in known, f"{source}: {name!r} in {expr!r} is not a metric shared/metrics.py declares"
            unknown = labels - known[name] - TARGET_LABELS
            assert not unknown, f"{source}: {name} has no label(s) {sorted(unknown)} (in {expr!r})"
            seen.add(name)
        # Grouping labels (`by (...)`) must exist on some metric the expression reads.
        available = set().union(*(known[n] for n, _ in _selectors(expr))) | TARGET_LABELS
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            grouped = {g.strip() for g in group.split(",") if g.strip()}
            assert grouped <= available, f"{source}: no metric in {expr!r} has label(s) {sorted(grouped - available)}"
    assert len(seen) >= 5, f"the selector parser found too little in {source}: {sorted(seen)}"


def test_the_selector_parser_catches_an_unknown_metric_and_label() -> None:
    assert _selectors('sum by (service) (rate(palace_nope_total{service="x"}[5m]))') == [
        ("palace_nope_total", {"service"})]
    assert _selectors("histogram_quantile(0.99, sum by (le) (rate(palace_search_seconds_bucket[5m])))") == [
        ("palace_search_seconds_bucket", set())]
    assert "palace_nope_total" not in _known()



def _promtool() -> str:
    found = shutil.which("promtool") or shutil.which("promtool", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("promtool not found (Debian's prometheus package; `make test` installs it into .venv/bin)")
    return found


def test_alert_rules_pass_promtool_check() -> None:
    promtool = _promtool()
    for args in (["check", "rules", str(ALERTS)], ["check", "config", str(PROM_CONFIG)]):
        run = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr


def test_alert_rules_unit_tests_pass() -> None:
    promtool = _promtool()
    run = subprocess.run([promtool, "test", "rules", str(ALERT_TESTS)], capture_output=True, text=True, timeout=120,
                         cwd=ALERT_TESTS.parent, env={**os.environ})
    assert run.returncode == 0, run.stdout + run.stderr
    tested = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"]}
    defined = {rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]}
    assert defined == tested, f"alerts without a unit test: {defined - tested}"
