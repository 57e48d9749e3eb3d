"""Every metric the Grafana dashboard and the Prometheus alerts read is one the running services really
export: after a session has gone through the pipeline and a search through the api, each service's
/metrics is scraped and the names (and, for the exercised ones, samples) are looked up."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from palace_dev.supervisor import ALL_SERVICES
from tests.integration.helpers import Stack, session, ws
from tests.unit.test_deploy_observability import (
    SYNTHETIC,
    _alert_exprs,
    _dashboard_exprs,
    _family_samples,
    _selectors,
)


def _scrape(stack: Stack) -> tuple[set[str], set[str]]:
    """(sample names any service declares, sample names with at least one sample) over all services."""
    declared: set[str] = set()
    observed: set[str] = set()
    for service in ALL_SERVICES:
        port = stack.supervisor.port_of(service)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, follow_redirects=True).text
        for family in text_string_to_metric_families(text):
            declared.update(_family_samples(family.name, family.type))
            observed.update(s.name for s in family.samples)
    return declared, observed


def test_dashboard_and_alert_metrics_are_exported_by_the_services(stack: Stack) -> None:
    workspace = ws()
    stack.publish(session(workspace, "s-metrics", [
        "We moved the weekly sync with the design team to Thursday afternoons.",
        "Noted: design sync on Thursdays from now on, I will update the calendar invite.",
    ]))
    stack.wait_processed(workspace, 2)
    assert stack.search(workspace, "when is the design sync?")
    declared, observed = _scrape(stack)

    named = {name for expr in [*_dashboard_exprs(), *_alert_exprs()] for name, _ in _selectors(expr)}
    missing = named - declared - set(SYNTHETIC)
    assert not missing, f"named in deploy/ but exported by no service: {sorted(missing)}"
    # What this traffic exercised has samples, not only a declaration.
    for sample in ("palace_messages_processed_total", "palace_handler_seconds_bucket", "palace_drawers_total",
                   "palace_embedded_texts_total", "palace_embed_seconds_bucket", "palace_search_seconds_bucket",
                   "palace_consumer_pending_messages"):
        assert sample in named and sample in observed, f"{sample}: no sample after exercising the pipeline"
