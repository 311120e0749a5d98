"""The docker-compose stack's files, checked without a container engine: the compose file
against the compose specification's JSON schema, the Prometheus file with promtool, the Grafana
dashboard against kclasync's metric exposition, and the files they all point at."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shutil
import subprocess
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from kclasync._runtime.metrics import metrics_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
WORKERS = ("worker-1", "worker-2", "worker-3")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def compose_validator() -> jsonschema.protocols.Validator:
    """The compose specification's schema, as vendored by check-jsonschema."""
    text = (
        resources.files("check_jsonschema")
        .joinpath("builtin_schemas", "vendor", "compose-spec.json")
        .read_text()
    )
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)  # type: ignore[no-any-return]


def test_compose_file_matches_the_specification() -> None:
    validator = compose_validator()
    doc = compose()
    errors = sorted(validator.iter_errors(doc), key=str)
    assert errors == [], "\n".join(e.message for e in errors)
    # The validator does reject what the specification forbids.
    broken = copy.deepcopy(doc)
    broken["services"]["worker-1"]["restart"] = {"policy": "always"}
    broken["services"]["grafana"]["bogus_key"] = 1
    assert len(list(validator.iter_errors(broken))) == 2


def test_compose_stack_has_every_part() -> None:
    services = compose()["services"]
    assert {"localstack", "producer", "dashboard", "prometheus", "grafana", *WORKERS} <= set(
        services
    )
    for name in (*WORKERS, "producer", "dashboard"):
        service = services[name]
        assert service["build"] == ".", name  # the top-level Dockerfile
        env = service["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://localstack:4566"
        assert service["depends_on"]["localstack"]["condition"] == "service_healthy"
    for worker in WORKERS:
        assert services[worker]["environment"]["KCLASYNC_WORKER_ID"] == worker
        assert services[worker]["command"] == ["python", "deploy/worker.py"]
    # The dashboard reads every worker's metrics; every published port is on loopback only.
    dashboard = services["dashboard"]["command"]
    assert dashboard[:2] == ["kclasync", "dashboard"]
    assert {a.split("=", 1)[1] for a in dashboard if a.startswith("--metrics=")} == {
        f"http://{w}:9100/metrics" for w in WORKERS
    }
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
        image = service.get("image", "")
        assert not image.endswith(":latest"), f"{name}: pin the image version"
    # Mounted files exist.
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source


def test_dockerfile_copies_what_exists() -> None:
    text = (ROOT / "Dockerfile").read_text()
    copied = [
        w for line in text.splitlines() if line.startswith("COPY ") for w in line.split()[1:-1]
    ]
    assert copied, "no COPY lines"
    for source in copied:
        assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert "uv sync --locked --no-dev" in text  # the image uses the lock file's versions
    assert re.search(r"^USER (?!root)", text, re.M), "the image runs as an unprivileged user"


def test_prometheus_scrapes_every_worker() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = [
        t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    ]
    services = compose()["services"]
    ports = {w: services[w]["environment"]["KCLASYNC_METRICS_PORT"] for w in WORKERS}
    assert sorted(targets) == sorted(f"{w}:{port}" for w, port in ports.items())


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian's prometheus) absent"
)
def test_promtool_accepts_the_config(tmp_path: pathlib.Path) -> None:
    ok = subprocess.run(["promtool", "check", "config", str(PROMETHEUS)], capture_output=True)
    assert ok.returncode == 0, ok.stderr.decode() + ok.stdout.decode()
    bad = tmp_path / "bad.yml"
    bad.write_text(PROMETHEUS.read_text().replace("scrape_interval: 5s", "scrape_interval: 5"))
    assert subprocess.run(["promtool", "check", "config", str(bad)], capture_output=True).returncode


def exposition() -> dict[str, tuple[str, ...]]:
    """Metric name -> label names, from kclasync's own exposition."""
    registry = CollectorRegistry()
    metrics = metrics_for(registry)
    text = generate_latest(registry).decode()
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    labels: dict[str, tuple[str, ...]] = {}
    for attr in vars(metrics).values():
        if hasattr(attr, "_labelnames"):
            name = attr._name + ("_total" if attr._type == "counter" else "")
            labels[name] = tuple(attr._labelnames)
    assert set(labels) == names
    return labels


def grafana_queries() -> list[tuple[str, str]]:
    dashboard = json.loads((GRAFANA / "dashboards" / "kclasync.json").read_text())
    queries = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    for var in dashboard["templating"]["list"]:
        queries.append((f"variable {var['name']}", var["query"]["query"]))
    return queries


def test_grafana_queries_use_only_exposed_metrics_and_labels() -> None:
    exposed = exposition()
    queries = grafana_queries()
    used: set[str] = set()
    for title, expr in queries:
        names = re.findall(r"\bkclasync_[a-z_]+", expr)
        assert names, f"{title}: no kclasync metric in {expr}"
        for name in names:
            assert name in exposed, f"{title}: {name} is not a kclasync metric"
            used.add(name)
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (g.strip() for g in group.split(",")):
                assert all(label in exposed[n] for n in names), f"{title}: no label {label}"
    # The panels the stack promises.
    titles = {title for title, _ in queries}
    for wanted in (
        "Leases per worker",
        "Records processed per second",
        "Millis behind latest",
        "Lease renewal failures",
        "Failovers",
        "Handoffs",
        "Processor errors",
    ):
        assert wanted in titles
    assert {"kclasync_leases_held", "kclasync_millis_behind_latest"} <= used


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    datasource = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["url"] == "http://prometheus:9090"
    dashboard = json.loads((GRAFANA / "dashboards/kclasync.json").read_text())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"]}
    assert uids == {source["uid"]}
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/kclasync.yml").read_text())
    mounts = compose()["services"]["grafana"]["volumes"]
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in mounts
