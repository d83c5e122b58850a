"""Every metric a provisioned Grafana dashboard queries is defined by some gpupool service.

The defined names are read from prometheus_client's default registry after importing every module that declares
metrics (the same registry each service's /metrics serves), expanded to the names a scrape exposes (`_total` for
counters, `_bucket`/`_sum`/`_count` for histograms). The queried names are extracted from every PromQL expression
in every dashboard: panel targets (nested rows included) and template-variable queries.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
# The modules whose import registers metrics on the default registry.
METRIC_MODULES = ("libs.observability.metrics", "libs.bus.lease", "services.gateway.bootstrap",
                  "services.agent.dcgm_metrics", "services.inventory.handlers", "services.inventory.fleet_metrics",
                  "services.reclamation.handlers")
# Series Prometheus itself attaches to every target, not exposed by any process.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
REQUIRED = {  # the dashboards issue 9 asks for
    "gpupool-overview": "platform overview",
    "gpupool-scheduler": "scheduler",
    "gpupool-queues-quotas": "queues and quotas",
    "gpupool-reclamation-waste": "reclamation and waste",
    "gpupool-bus-health": "bus health",
}

SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("_sum", "_count", "_created"), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "atan2", "inf", "nan"}


# --------------------------------------------------------------------------- what the services define


def defined_metrics() -> set[str]:
    for module in METRIC_MODULES:
        importlib.import_module(module)
    # The agent's DCGM gauges are created on first use (one set per registry): create them as the agent does.
    importlib.import_module("services.agent.dcgm_metrics").default_metrics()
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def recorded_metrics() -> set[str]:
    """The series gpupool's recording rules (deploy/prometheus/rules, loaded by every deployment) write: a dashboard
    may query them (test_prometheus_rules.py checks that the rules query only metrics the services define)."""
    import yaml

    return {rule["record"] for path in RULES_DIR.glob("*.yml") if not path.stem.endswith("_test")
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"] if "record" in rule}


@pytest.fixture(scope="module")
def defined() -> set[str]:
    return defined_metrics() | recorded_metrics()


# --------------------------------------------------------------------------- what the dashboards query


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (Grafana variables allowed). Not a full parser: enough for the
    subset dashboards use, and conservative: anything that looks like a bare identifier counts as a metric."""
    labels_arg = re.match(r"\s*label_values\((.*),\s*\w+\s*\)\s*$", expr, re.S)
    if labels_arg:  # label_values(<selector>, <label>) — the label is not a metric
        expr = labels_arg.group(1)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range / subquery selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)  # Grafana variables used as values
    names = set()
    for m in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def dashboards() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def expressions(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in panels(board.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel.get("title", "?"), target["expr"]
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            if query:
                yield f"variable ${var['name']}", query


def undefined_metrics(board: dict[str, Any], defined: set[str]) -> list[str]:
    return sorted({f"{where}: {name}" for where, expr in expressions(board) for name in metric_names(expr)
                   if name not in defined and name not in PROMETHEUS_SYNTHETIC})


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.stem)
def test_every_metric_a_dashboard_queries_is_defined_by_a_service(path: Path, defined: set[str]) -> None:
    board = json.loads(path.read_text())
    assert list(expressions(board)), f"{path.name} queries nothing"
    assert undefined_metrics(board, defined) == []


def test_an_undefined_metric_is_caught(defined: set[str]) -> None:
    board = json.loads((DASHBOARDS / "gpupool-scheduler.json").read_text())
    board["panels"].append({"type": "row", "panels": [{"title": "made up", "targets": [
        {"expr": 'histogram_quantile(0.9, sum by (le) (rate(gpupool_made_up_seconds_bucket{job="x"}[5m])))'}]}]})
    board["templating"]["list"].append({"name": "t", "type": "query", "query": "label_values(gpupool_nope, team)"})
    assert undefined_metrics(board, defined) == ["made up: gpupool_made_up_seconds_bucket",
                                                 "variable $t: gpupool_nope"]


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (consumer, outcome) (rate(gpupool_bus_messages_total{consumer=~"$consumer"}[$__rate_interval]))',
     {"gpupool_bus_messages_total"}),
    ('histogram_quantile(0.95, sum by (le) (rate(gpupool_bus_handle_seconds_bucket{job=~"$job"}[5m])))',
     {"gpupool_bus_handle_seconds_bucket"}),
    ("sum(a_total) / clamp_min(sum(b_total), 1e-9)", {"a_total", "b_total"}),
    ("sum(x and on (gpu) y < $idle_pct) or vector(0)", {"x", "y"}),
    ("sum(count_over_time((g{h=~\"$hostname\"} < 5)[$__range:1m])) / 60", {"g"}),
    ("label_values(up{platform=\"gpupool\"}, job)", {"up"}),
    ('max by (replica) (gpupool_leader{service="placement"}) offset 5m', {"gpupool_leader"}),
])
def test_metric_names_are_extracted_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_defined_names_include_every_kind_of_metric(defined: set[str]) -> None:
    assert {"gpupool_bus_messages_total", "gpupool_bus_handle_seconds_bucket", "gpupool_bus_handle_seconds_count",
            "gpupool_leader", "gpupool_gateway_requests_total", "DCGM_FI_DEV_GPU_UTIL"} <= defined
    assert "gpupool_leader_total" not in defined and "gpupool_outbox_pending_bucket" not in defined
    assert {"gpupool_gpu_allocation_info", "gpupool:gpu_utilization:avg_by_team"} <= defined


def test_the_dashboards_the_issue_asks_for_exist_and_are_well_formed() -> None:
    boards = {p.stem: json.loads(p.read_text()) for p in dashboards()}
    assert REQUIRED.keys() <= boards.keys()
    uids = [b["uid"] for b in boards.values()]
    assert len(uids) == len(set(uids))
    for stem, board in boards.items():
        assert board["uid"] == stem, f"{stem}.json: uid {board['uid']!r} should be the file name"
        assert board["title"].startswith("gpupool — ")
        assert "gpupool" in board["tags"]
        ids = [p["id"] for p in panels(board["panels"]) if "id" in p]
        assert len(ids) == len(set(ids)), f"{stem}: duplicate panel ids"
        for panel in panels(board["panels"]):
            for target in panel.get("targets", []):
                assert target.get("datasource", {}).get("uid") == "${datasource}", f"{stem}: {panel['title']}"
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, f"{stem}: {panel['title']} is wider than the grid"


def test_grafana_provisions_the_dashboard_folder_with_the_datasource_uid() -> None:
    import yaml

    providers = yaml.safe_load((PROVISIONING / "dashboards" / "dashboards.yaml").read_text())["providers"]
    assert any(p["type"] == "file" and p["options"]["path"] == "/var/lib/grafana/dashboards" for p in providers)
    sources = yaml.safe_load((PROVISIONING / "datasources" / "datasources.yaml").read_text())["datasources"]
    assert any(s["type"] == "prometheus" and s["uid"] == "prometheus" for s in sources)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in compose["services"]["grafana"]["volumes"]


def test_no_gpupool_metric_carries_a_label_prometheus_sets_on_every_series() -> None:
    # `instance` and `job` are the scrape target's: a series of our own with them clashes (exported_instance)
    import importlib

    from prometheus_client import REGISTRY

    for module in ("libs.observability.metrics", "libs.bus.lease", "services.agent.dcgm_metrics",
                   "services.agent.sample_buffer", "services.agent.handlers", "services.inventory.handlers",
                   "services.reclamation.handlers"):
        importlib.import_module(module)
    ours = {name: getattr(c, "_labelnames", ()) for c, names in REGISTRY._collector_to_names.items()
            for name in names if name.startswith("gpupool_")}
    assert "gpupool_leader" in ours and ours["gpupool_leader"] == ("service", "replica")
    assert {name: labels for name, labels in ours.items() if {"instance", "job"} & set(labels)} == {}
