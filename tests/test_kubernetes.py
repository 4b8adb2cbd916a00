"""deploy/kubernetes: rendered by `kubectl kustomize`, every object validated against the
Kubernetes schemas (kubernetes-validate, strict, offline) and KEDA's own CRDs (tests/fixtures/keda,
KEDA v2.20.1), and the KEDA query run against a real QForge database."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jsonschema
import kubernetes_validate
import psycopg
import pytest
import yaml

from qforge.commands.claim import claim
from test_worker_support import add_jobs

BASE = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
KEDA_DIR = Path(__file__).parent / "fixtures" / "keda"
POSTGRESQL_SCALER = json.loads((KEDA_DIR / "postgresql_scaler.json").read_text())
KUBERNETES_VERSIONS = ("1.28", "1.33")


def render(folder: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (Debian's kubernetes-client) is not installed")
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render(BASE)


def by_kind(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def _strict(schema: dict) -> dict:
    """A CRD's structural schema as the API server's strict field validation applies it: an object
    that lists its properties refuses others, unless it preserves unknown fields."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: _strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = _strict(schema[key])
    return schema


def _crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict openAPIV3Schema of each version of KEDA's CRDs."""
    schemas = {}
    for path in sorted((KEDA_DIR / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


KEDA_SCHEMAS = _crd_schemas()
# Metadata QForge's trigger needs besides what KEDA requires: without a target, KEDA's
# postgresql scaler would scale on a default that knows nothing of the runners' concurrency.
QFORGE_TRIGGER_NEEDS = ["targetQueryValue"]


def keda_errors(obj: dict) -> list[str]:
    schema = KEDA_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if schema is None:
        return [f"KEDA has no CRD for {obj['apiVersion']} {obj['kind']}"]
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
    for trigger in obj.get("spec", {}).get("triggers", []) if obj["kind"] == "ScaledObject" else []:
        if trigger["type"] == "postgresql":
            rules = POSTGRESQL_SCALER
            allowed = set(rules["trigger_metadata"]) | {f"{name}FromEnv" for name in rules["resolved_env"]}
            errors += [f"postgresql trigger: unknown metadata {key!r}" for key in trigger["metadata"]
                       if key not in allowed]
            errors += [f"postgresql trigger: missing {key!r}" for key in rules["required"] + QFORGE_TRIGGER_NEEDS
                       if key not in trigger["metadata"]]
    return errors


def validate(obj: dict) -> None:
    if obj["apiVersion"].startswith("keda.sh/"):
        assert keda_errors(obj) == []
    else:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_every_object_is_valid_for_kubernetes_and_keda(objects):
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["ConfigMap", "Secret", "Service", "Service", "Deployment", "Deployment", "StatefulSet",
                            "PodDisruptionBudget", "PodDisruptionBudget", "PodDisruptionBudget", "Job",
                            "ScaledObject", "TriggerAuthentication", "PersistentVolumeClaim"])
    for obj in objects:
        validate(obj)


def test_a_broken_object_fails_validation(objects):
    runner = copy.deepcopy(by_kind(objects, "StatefulSet"))
    runner["spec"]["replicaz"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(runner, KUBERNETES_VERSIONS[-1], strict=True)
    api = copy.deepcopy(by_kind(objects, "Deployment", "qforge-api"))
    api["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "often"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, KUBERNETES_VERSIONS[0], strict=True)
    scaled = copy.deepcopy(by_kind(objects, "ScaledObject"))
    scaled["spec"]["maxReplicas"] = 5  # HPA's word, not KEDA's
    del scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue"]
    scaled["spec"]["triggers"][0]["metadata"]["targetQueryValue2"] = "8"
    scaled["spec"]["advanced"] = {"horizontalPodAutoscalerConfig": {"behaviour": {}}}  # British spelling
    errors = keda_errors(scaled)
    assert any("maxReplicas" in e for e in errors)
    assert any("behaviour" in e for e in errors), errors
    assert "postgresql trigger: unknown metadata 'targetQueryValue2'" in errors
    assert "postgresql trigger: missing 'targetQueryValue'" in errors


def test_the_roles_are_deployed_as_the_issue_says(objects):
    settings = by_kind(objects, "ConfigMap")["data"]
    grace = float(settings["QFORGE_SHUTDOWN_GRACE_SECONDS"])
    api = by_kind(objects, "Deployment", "qforge-api")["spec"]["template"]["spec"]
    assert api["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    service = by_kind(objects, "Service", "qforge-api")
    assert service["spec"]["selector"] == by_kind(objects, "Deployment", "qforge-api")["spec"]["selector"]["matchLabels"]
    monitor = by_kind(objects, "Deployment", "qforge-monitor")
    assert monitor["spec"]["replicas"] == 2
    # Retention: the leader archives to a claim both monitors mount at QFORGE_ARCHIVE_DIR.
    mounts = {m["name"]: m["mountPath"] for m in monitor["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in monitor["spec"]["template"]["spec"]["volumes"]}
    archive_volume = next(name for name, path in mounts.items() if path == settings["QFORGE_ARCHIVE_DIR"])
    assert by_kind(objects, "PersistentVolumeClaim", claims[archive_volume])["spec"]["accessModes"] == ["ReadWriteMany"]
    assert settings["QFORGE_ARCHIVE_AFTER"] and settings["QFORGE_LOG_PARTITION_MAX_AGE"]
    runner = by_kind(objects, "StatefulSet")
    pod = runner["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:4] == ["qforge", "worker", "--name", "$(POD_NAME)"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in pod["containers"][0]["env"]
    assert pod["terminationGracePeriodSeconds"] > grace
    assert by_kind(objects, "Job")["spec"]["template"]["spec"]["containers"][0]["command"] == ["qforge", "migrate"]
    budgets = {o["metadata"]["name"] for o in objects if o["kind"] == "PodDisruptionBudget"}
    assert budgets == {"qforge-runner", "qforge-api", "qforge-monitor"}
    for obj in objects:
        template = obj.get("spec", {}).get("template", {}).get("spec")
        if template is None:
            continue
        assert template["terminationGracePeriodSeconds" if obj["kind"] != "Job" else "restartPolicy"]
        for container in template["containers"]:
            assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
            # each process on its own role (issue 30): only the migrate Job has the owner's URL
            own = {"Job": "QFORGE_DATABASE_URL", "qforge-api": "QFORGE_API_DATABASE_URL",
                   "qforge-monitor": "QFORGE_MONITOR_DATABASE_URL",
                   "qforge-runner": "QFORGE_WORKER_DATABASE_URL"}
            wanted = own["Job"] if obj["kind"] == "Job" else own[obj["metadata"]["name"]]
            names = {e["name"] for e in container.get("env", [])}
            assert wanted in names, (obj["metadata"]["name"], names)
            if obj["kind"] != "Job":
                assert "QFORGE_DATABASE_URL" not in names, obj["metadata"]["name"]
    scaled = by_kind(objects, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "qforge-runner"}
    [trigger] = scaled["triggers"]
    assert trigger["type"] == "postgresql" and trigger["authenticationRef"]["name"] == "qforge-db"
    auth = by_kind(objects, "TriggerAuthentication")["spec"]["secretTargetRef"]
    assert auth == [{"parameter": "connection", "name": "qforge", "key": "readonly-database-url"}]
    assert {ref["parameter"] for ref in auth} <= set(POSTGRESQL_SCALER["auth_parameters"])
    assert set(by_kind(objects, "Secret")["stringData"]) >= {"database-url", "api-token"}


def test_a_name_prefix_keeps_the_keda_references(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(BASE, overlay)  # kustomize takes no absolute paths
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namePrefix": "team-", "resources": [base]}))
    try:
        objects = render(overlay)
    except AssertionError:
        # kubectl 1.20 (Debian's older kubernetes-client) wants a base under `bases:`
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "namePrefix": "team-", "bases": [base]}))
        objects = render(overlay)
    scaled = by_kind(objects, "ScaledObject")
    assert scaled["metadata"]["name"] == "team-qforge-runner"
    assert scaled["spec"]["scaleTargetRef"]["name"] == by_kind(objects, "StatefulSet")["metadata"]["name"] \
        == "team-qforge-runner"
    assert scaled["spec"]["triggers"][0]["authenticationRef"]["name"] == "team-qforge-db"
    assert by_kind(objects, "TriggerAuthentication")["spec"]["secretTargetRef"][0]["name"] == "team-qforge"
    assert by_kind(objects, "Secret")["metadata"]["name"] == "team-qforge"


def test_the_keda_query_counts_due_pending_and_running_jobs(objects, conn):
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    add_jobs(conn, *({"task": "echo", "queue": "default"} for _ in range(7)))
    add_jobs(conn, *({"task": "echo", "queue": "default", "run_at": later} for _ in range(4)))  # not due
    add_jobs(conn, *({"task": "echo", "queue": "other"} for _ in range(3)))
    add_jobs(conn, {"task": "echo", "queue": "other", "fairness_key": "tenant"},  # the flow index's jobs
             {"task": "echo", "queue": "other", "concurrency_key": "k", "concurrency_limit": 1})
    claim(conn, ["default"], 2, "runner-0")  # 2 running, 5 due pending
    query = by_kind(objects, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert conn.execute(query).fetchone() == {"queue_demand": 7}
    assert conn.execute("SELECT queue_demand('default', 3)").fetchone() == {"queue_demand": 5}  # capped pending
    assert conn.execute("SELECT queue_demand('other')").fetchone() == {"queue_demand": 5}
    assert conn.execute("SELECT queue_demand('nobody')").fetchone() == {"queue_demand": 0}
    conn.execute("SELECT queue_counts_compact()")  # running now counted from queue_counts, not deltas
    assert conn.execute(query).fetchone() == {"queue_demand": 7}


def test_the_oldest_due_pending_job_is_found_in_both_pending_indexes_and_every_priority(conn):
    now = datetime.now(timezone.utc)
    oldest = lambda queue: conn.execute("SELECT queue_oldest_due(%s) AS at", [queue]).fetchone()["at"]  # noqa: E731
    add_jobs(conn, {"task": "echo", "queue": "q", "priority": 5, "run_at": now - timedelta(minutes=1)},
             {"task": "echo", "queue": "q", "priority": 1, "run_at": now - timedelta(minutes=5)},
             {"task": "echo", "queue": "q", "priority": 9, "run_at": now + timedelta(hours=1)})  # not due
    assert oldest("q") == now - timedelta(minutes=5)
    add_jobs(conn, {"task": "echo", "queue": "q", "priority": 3, "fairness_key": "t",
                    "run_at": now - timedelta(minutes=9)})
    assert oldest("q") == now - timedelta(minutes=9)
    add_jobs(conn, {"task": "echo", "queue": "q", "priority": 7, "concurrency_key": "k", "concurrency_limit": 2,
                    "run_at": now - timedelta(minutes=20)})
    assert oldest("q") == now - timedelta(minutes=20)
    assert oldest("nobody") is None
    add_jobs(conn, {"task": "echo", "queue": "later", "run_at": now + timedelta(minutes=1)})
    assert oldest("later") is None


def test_the_keda_query_reads_the_pending_indexes(conn):
    source = (BASE.parent.parent / "migrations" / "definitions" / "75_scaling.sql").read_text()
    for shape, index in (("AND j.concurrency_key IS NULL AND j.fairness_key IS NULL", "jobs_claim_plain"),
                         ("AND (j.concurrency_key IS NOT NULL OR j.fairness_key IS NOT NULL)",
                          "jobs_pending_flow")):
        query = ("SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE j.status = 'pending' AND j.queue = 'default'"
                 f" AND j.run_at <= now() {shape} LIMIT 1000) due")
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")  # a tiny table: make the planner show its index
            plan = "\n".join(row["QUERY PLAN"] for row in conn.execute("EXPLAIN " + query))
        assert index in plan, plan
        assert "j.status = 'pending' AND j.queue = p_queue AND j.run_at <= now()\n" in source
        assert shape in source  # queue_demand() has the same shape
