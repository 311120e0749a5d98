"""Reference pages generated from the code: the configuration (every ``ConsumerConfig`` field)
and the metrics (every family ``ConsumerMetrics`` registers).

Used as an mkdocs hook (``hooks:`` in mkdocs.yml adds both pages to every build, so they cannot
go stale) and from the tests; ``python docs/gen_reference.py config|metrics`` prints a page.
"""

from __future__ import annotations

import enum
import inspect
import re
import sys
import textwrap
from typing import Any

import attrs

from kclasync._config import ConsumerConfig
from kclasync._runtime.metrics import ConsumerMetrics

CONFIG_PAGE = "configuration.md"
METRICS_PAGE = "metrics.md"

_FIELD_LINE = re.compile(r"^    (\w+): ")


def field_docs(cls: type = ConsumerConfig) -> dict[str, str]:
    """The ``#:`` comment block above each field of ``cls``, joined into one paragraph."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    for line in textwrap.dedent(inspect.getsource(cls)).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = _FIELD_LINE.match(line)
        if match and pending:
            docs[match[1]] = " ".join(pending)
        if match or not stripped:
            pending = []
    return docs


def _default(field: attrs.Attribute[Any]) -> str:
    value = field.default
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if value is None:
        return "`None`"
    if hasattr(value, "kind") and isinstance(value.kind, enum.Enum):  # InitialPosition
        return f"`{value.kind.value}`"
    return f"`{value!r}`"


_UNITS = {"s": "seconds", "": "–"}


def config_rows(cls: type = ConsumerConfig) -> list[dict[str, str]]:
    """One row per field; raises ValueError naming a field without a doc comment or metadata."""
    docs = field_docs(cls)
    rows = []
    for field in attrs.fields(cls):
        missing = [k for k in ("unit", "kcl") if k not in field.metadata]
        if field.name not in docs or missing:
            raise ValueError(
                f"{cls.__name__}.{field.name} needs a `#:` comment and metadata=_meta(unit, kcl)"
            )
        unit = str(field.metadata["unit"])
        rows.append(
            {
                "name": field.name,
                "default": _default(field),
                "unit": _UNITS.get(unit, unit),
                "kcl": f"`{field.metadata['kcl']}`" if field.metadata["kcl"] else "–",
                "doc": docs[field.name],
            }
        )
    return rows


def config_page() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from kclasync/_config.py by docs/gen_reference.py: edit the field's",
        "`#:` comment and metadata there, not this page. -->",
        "",
        "Every field of `ConsumerConfig`, keyword-only. Times are in **seconds** (the Java KCL's",
        "settings are in milliseconds: `failoverTimeMillis=10000` is `failover_time=10.0`).",
        "Defaults match the Java KCL's where it has the setting. A bad value raises",
        "`ConfigError` naming the field.",
        "",
        "```python",
        "from kclasync import Consumer, ConsumerConfig",
        "",
        'config = ConsumerConfig(failover_time=20.0, initial_position="TRIM_HORIZON")',
        'Consumer(stream_name="orders", application_name="billing", processor=handle,'
        " config=config)",
        "```",
        "",
        "| field | default | unit | Java KCL | meaning |",
        "|---|---|---|---|---|",
    ]
    for row in config_rows():
        doc = row["doc"].replace("|", "\\|")
        lines.append(
            f"| `{row['name']}` | {row['default']} | {row['unit']} | {row['kcl']} | {doc} |"
        )
    lines += [
        "",
        "Derived periods: leases are renewed every `failover_time / 3 - epsilon` (3.308 s by",
        "default) and the taker scans every `lease_taker_interval`, by default",
        "`failover_time + epsilon` (10.025 s; the Java KCL's taker period is twice that).",
        "",
    ]
    return "\n".join(lines)


def metric_rows() -> list[dict[str, str]]:
    """One row per metric family, as Prometheus exposes it (counters with ``_total``)."""
    from prometheus_client import CollectorRegistry

    metrics = ConsumerMetrics(CollectorRegistry())
    rows = []
    for attribute, metric in vars(metrics).items():
        (family,) = metric.describe()
        name = family.name + ("_total" if family.type == "counter" else "")
        labels: tuple[str, ...] = metric._labelnames
        if not family.documentation:
            raise ValueError(f"metric {name} ({attribute}) has no help text")
        rows.append(
            {
                "name": name,
                "type": family.type,
                "labels": ", ".join(f"`{label}`" for label in labels),
                "doc": family.documentation,
            }
        )
    return rows


def metrics_page() -> str:
    lines = [
        "# Metrics reference",
        "",
        "<!-- Generated from kclasync/_runtime/metrics.py by docs/gen_reference.py. -->",
        "",
        "Every worker exports these to a `prometheus_client` registry (`registry=` on `Consumer`;",
        "the global one by default, which `prometheus_client.make_asgi_app()` or",
        "`kclasync.integrations.aiohttp.add_metrics_route` serve). Workers sharing a registry",
        "are told apart by `worker`; per-shard series carry `stream` and `shard`.",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    for row in metric_rows():
        lines.append(f"| `{row['name']}` | {row['type']} | {row['labels']} | {row['doc']} |")
    lines += [
        "",
        "Useful queries:",
        "",
        "- leases per worker: `sum by (worker) (kclasync_leases_held)`",
        "- records per second: `sum(rate(kclasync_records_processed_total[1m]))`",
        "- lag: `max by (shard) (kclasync_millis_behind_latest)`",
        "- failovers and steals: `sum(increase(kclasync_lease_takes_total[5m]))`,",
        "  `sum(increase(kclasync_lease_steals_total[5m]))`",
        "",
        "See [Operations](operations.md) for the alarms worth setting on them.",
        "",
    ]
    return "\n".join(lines)


PAGES = {CONFIG_PAGE: config_page, METRICS_PAGE: metrics_page}


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated pages to the build."""
    from mkdocs.structure.files import File

    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "config"
    print({"config": config_page, "metrics": metrics_page}[which]())
