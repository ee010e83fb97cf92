"""docs/metrics.md lists every metric a coordinator exports, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from geofl.server.metrics import RunMetrics, UploadBufferCollector
from geofl.server.models.spool import MemoryBudget

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
#: The name a family is scraped under, by its type (counters and infos get a suffix).
SUFFIX = {"counter": "_total", "info": "_info"}


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    RunMetrics(registry)
    registry.register(UploadBufferCollector(MemoryBudget(1)))
    return {family.name + SUFFIX.get(family.type, "") for family in registry.collect()}


def documented_names() -> set[str]:
    rows = re.findall(r"^\| `(geofl_[a-z_]+)` \|", DOC.read_text(), flags=re.MULTILINE)
    assert len(rows) == len(set(rows)), "a metric is listed twice"
    return set(rows)


def test_the_table_lists_every_exported_metric() -> None:
    assert documented_names() == exported_names()


def test_the_documented_help_agrees_on_types() -> None:
    text = DOC.read_text()
    registry = CollectorRegistry()
    RunMetrics(registry)
    for family in registry.collect():
        name = family.name + SUFFIX.get(family.type, "")
        kind = "state set" if family.type == "stateset" else family.type
        assert f"| `{name}` | {kind} |" in text, name
