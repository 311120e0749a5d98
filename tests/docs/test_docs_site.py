"""The docs site: generated references complete, examples identical to the runnable ones, and
``mkdocs build --strict`` passing offline."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import attrs
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import kclasync.integrations.aiohttp
import kclasync.integrations.asgi
from kclasync._config import ConsumerConfig
from kclasync._runtime.metrics import ConsumerMetrics
from tests.integrations.test_web_services import example

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs/gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_every_config_field_is_documented_with_unit_and_kcl_name() -> None:
    rows = {row["name"]: row for row in gen.config_rows()}
    assert list(rows) == [f.name for f in attrs.fields(ConsumerConfig)]
    assert all(row["doc"] for row in rows.values())
    assert rows["failover_time"] == {
        "name": "failover_time",
        "default": "`10.0`",
        "unit": "seconds",
        "kcl": "`failoverTimeMillis`",
        "doc": "A lease whose counter has not moved for this long is expired "
        "(KCL failoverTimeMillis).",
    }
    page = gen.config_page()
    for name in rows:
        assert f"| `{name}` |" in page


def test_a_field_without_a_doc_comment_fails_the_generator() -> None:
    @attrs.frozen
    class Partial:
        #: Documented.
        a: int = attrs.field(default=1, metadata={"unit": "", "kcl": ""})
        b: int = attrs.field(default=2, metadata={"unit": "", "kcl": ""})

    with pytest.raises(ValueError, match=r"Partial\.b needs a `#:` comment"):
        gen.config_rows(Partial)


def test_every_exposed_metric_is_in_the_metrics_reference() -> None:
    registry = CollectorRegistry()
    ConsumerMetrics(registry)
    exposed = re.findall(r"^# TYPE (\S+) (\S+)$", generate_latest(registry).decode(), re.M)
    assert len(exposed) >= 15
    page = gen.metrics_page()
    for name, kind in exposed:
        assert re.search(rf"^\| `{name}` \| {kind} \| .+ \| \S.* \|$", page, re.M), name


@pytest.mark.parametrize("module", [kclasync.integrations.asgi, kclasync.integrations.aiohttp])
def test_web_service_page_shows_the_tested_examples(module: ModuleType) -> None:
    page = (ROOT / "docs/integrations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert example(module) in blocks


@pytest.mark.parametrize("module", [kclasync.integrations.asgi, kclasync.integrations.aiohttp])
def test_web_service_examples_stay_local_and_say_where_reading_starts(module: ModuleType) -> None:
    code = example(module)
    assert "0.0.0.0" not in code
    if "run_app" in code:
        assert 'web.run_app(app, host="127.0.0.1",' in code
    flat = " ".join(line.strip(" #") for line in code.splitlines())
    assert (
        "Starts at LATEST (the default): records put before this application first takes a "
        "shard's lease are not read." in flat
    )
    assert 'initial_position="TRIM_HORIZON"' in flat


def test_dashboard_page_says_kclasync_workers_write_throughput() -> None:
    page = " ".join((ROOT / "docs/dashboard.md").read_text().split())
    assert "do not write it yet" not in page
    assert "written at each renewal by kclasync and KCL 3.x workers" in page


def test_mkdocs_build_strict_offline(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr
    config = (tmp_path / "configuration/index.html").read_text()
    assert "lease_audit_threshold" in config and "failoverTimeMillis" in config
    assert "kclasync_leases_held" in (tmp_path / "metrics/index.html").read_text()
    for page in tmp_path.rglob("*.html"):
        assert "fonts.googleapis.com" not in page.read_text(), page
