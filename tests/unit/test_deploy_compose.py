"""docker-compose.yml without a Docker engine: the servers, the migration before every service, each
service's command really exists in the repository, the api runs with authentication, and Prometheus
and Grafana are wired to the files in deploy/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose

from shared.config import Settings
from tests.unit.deploy_checks import check_command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SERVICES = ["ingest", "embed", "classify", "cluster", "enrich", "maintain", "api"]



def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _services() -> dict[str, Any]:
    return _compose()["services"]


def _setting_names() -> set[str]:
    return {f"PALACE_{name.upper()}" for name in Settings.model_fields}


def test_check_command_rejects_what_does_not_exist() -> None:
    with pytest.raises(AssertionError):
        check_command(["python", "-m", "services.nope"])
    with pytest.raises(AssertionError, match="nope"):
        check_command(["palace", "nope"])
    with pytest.raises(AssertionError, match="no-such-flag"):
        check_command(["palace", "migrate", "--no-such-flag"])
    assert check_command(["palace", "migrate", "--check"]) == "palace migrate"


def test_the_file_follows_the_compose_specification() -> None:
    # compose_spec (a Rust parser of the Compose specification) rejects unknown keys and invalid values;
    # it does not read YAML merge keys, so it gets the document PyYAML resolved them in.
    spec = PyCompose.from_json(json.dumps(_compose()))
    spec.validate()
    assert set(spec.service_names()) == set(_services())
    broken = _compose()
    broken["services"]["migrate"]["depends_on"]["postgres"]["condition"] = "service_ready"
    with pytest.raises(ValueError, match="service_ready"):
        PyCompose.from_json(json.dumps(broken))


def test_servers_are_the_official_images_with_jetstream_and_pgvector() -> None:
    svc = _services()
    assert svc["postgres"]["image"].startswith("pgvector/pgvector:")
    assert svc["nats"]["image"].startswith("nats:")
    nats_cmd = svc["nats"]["command"]
    assert "--jetstream" in nats_cmd or "-js" in nats_cmd
    assert "--store_dir" in nats_cmd or "-sd" in nats_cmd, "JetStream keeps its data on the volume"
    for name in ("postgres", "nats"):
        assert "healthcheck" in svc[name], f"{name} has a healthcheck the others wait on"


def test_every_service_runs_a_command_that_exists_after_the_migration() -> None:
    svc = _services()
    migrate = svc["migrate"]
    assert check_command(migrate["command"]) == "palace migrate"
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in SERVICES:
        assert name in svc, f"docker-compose.yml has no {name}"
        s = svc[name]
        assert check_command(s["command"]) == f"services.{name}"
        assert s["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
        assert (ROOT / s["build"]["context"] / s["build"]["dockerfile"]).is_file()
        assert s["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        grace = float(str(s["stop_grace_period"]).removesuffix("s"))
        assert grace > Settings().shutdown_grace_s, f"{name}: stop_grace_period must outlast the drain"


def test_configuration_is_palace_settings_and_the_api_requires_keys() -> None:
    svc = _services()
    known = _setting_names()
    for name in [*SERVICES, "migrate"]:
        env = svc[name]["environment"]
        unknown = {k for k in env if k.startswith("PALACE_")} - known
        assert not unknown, f"{name}: not settings in shared/config.py: {unknown}"
        assert env["PALACE_DATABASE_URL"].startswith("postgresql://") and env["PALACE_NATS_URL"].startswith("nats://")
    for name in SERVICES[:-1]:
        env = svc[name]["environment"]
        assert env["PALACE_METRICS_HOST"] == "0.0.0.0" and env["PALACE_METRICS_PORT"] == "9100"
    api = svc["api"]["environment"]
    assert api["PALACE_API_HOST"] == "0.0.0.0"
    assert api["PALACE_API_AUTH"] == "true", "the api listens beyond loopback only with authentication on"
    assert api["PALACE_API_BOOTSTRAP_KEYS"].startswith("${PALACE_API_BOOTSTRAP_KEYS:?"), \
        "compose refuses to start the api without keys"
    for port in svc["api"]["ports"]:
        assert port.startswith("127.0.0.1:"), "published ports stay on the host's loopback"



def test_prometheus_scrapes_every_service_and_grafana_gets_the_dashboard() -> None:
    svc = _services()
    mounts = {v.split(":")[1]: v.split(":")[0] for name in ("prometheus", "grafana") for v in svc[name]["volumes"]
              if v.startswith("./")}
    for container_path, host_path in mounts.items():
        assert (ROOT / host_path).exists(), f"{host_path} (mounted at {container_path}) is missing"
    prom = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    assert prom["rule_files"] == ["alerts.yml"] and "/etc/prometheus/alerts.yml" in mounts
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    port = {name: "8080" if name == "api" else svc[name]["environment"]["PALACE_METRICS_PORT"] for name in SERVICES}
    assert targets == {f"{name}:{port[name]}" for name in SERVICES}
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/palace.yml").read_text())
    dash_dir = provider["providers"][0]["options"]["path"]
    assert mounts[f"{dash_dir}/palace.json"] == "./deploy/grafana/palace.json"
    datasources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
