"""deploy/prometheus/rules: the alert rules pass `promtool check rules`, their unit tests pass `promtool test rules`
(and a broken rule fails them), they query only metrics gpupool defines, and every deployment loads them.

Reproduce: `promtool check rules deploy/prometheus/rules/gpupool.yml` and
`promtool test rules deploy/prometheus/rules/gpupool_test.yml` (Debian's `prometheus` package ships promtool).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.ecosystem import debian_tool
from tests.unit.deploy.test_dashboards import defined_metrics, metric_names
from tests.unit.deploy.test_kubernetes import SERVICES, workloads

ROOT = Path(__file__).resolve().parents[3]
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "gpupool.yml"
REQUIRED_ALERTS = {  # what issue 20 asks the rules to cover
    "GpupoolConsumerLagging": "consumer lag", "GpupoolDeadLettersGrowing": "DLQ growth",
    "GpupoolSchedulerStalled": "scheduler stalled", "GpupoolGpuQuarantined": "GPU quarantined",
    "GpupoolNodeLost": "node lost", "GpupoolIdleAllocationsHigh": "idle allocations above a share",
    "GpupoolQuotaExhausted": "quota exhausted",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([debian_tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def rules() -> list[dict]:
    return [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_runs_the_rules_unit_tests() -> None:
    tests = sorted(RULES_DIR.glob("*_test.yml"))
    assert tests
    done = promtool("test", "rules", *map(str, tests))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_changed_threshold_fails_the_rules_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests against rules whose lag threshold moved from 1000 to 10000."""
    (tmp_path / "gpupool.yml").write_text(RULES.read_text().replace("gpupool_bus_consumer_pending) > 1000",
                                                                    "gpupool_bus_consumer_pending) > 10000"))
    shutil.copy(RULES_DIR / "gpupool_test.yml", tmp_path / "gpupool_test.yml")
    done = promtool("test", "rules", str(tmp_path / "gpupool_test.yml"))
    assert done.returncode != 0 and "GpupoolConsumerLagging" in done.stdout + done.stderr


def test_the_rules_cover_what_the_issue_asks_with_severity_and_summary() -> None:
    alerts = {r["alert"]: r for r in rules()}
    assert set(REQUIRED_ALERTS) <= set(alerts)
    for rule in alerts.values():
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]


def test_the_rules_query_only_metrics_gpupool_defines() -> None:
    defined = defined_metrics()
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= defined, (rule["alert"], names - defined)


def test_compose_prometheus_loads_the_rules_file_it_mounts() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/gpupool.yml"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./deploy/prometheus/rules:/etc/prometheus/rules:ro" in compose["services"]["prometheus"]["volumes"]


def test_the_operators_prometheusrule_holds_exactly_the_rules_file() -> None:
    rule = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text()), (
        "deploy/kubernetes/monitoring/prometheusrule.yaml differs from deploy/prometheus/rules/gpupool.yml: "
        "copy the groups over")


def test_the_podmonitor_scrapes_every_gpupool_service_pod_on_its_metrics_port() -> None:
    """The PodMonitor (a Prometheus Operator CRD, which kubernetes-validate has no schema for) is checked against the
    workloads it must find: each service's pods carry the selected name label and serve /metrics on port `http`."""
    monitoring = ROOT / "deploy" / "kubernetes" / "monitoring"
    kustomization = yaml.safe_load((monitoring / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in monitoring.glob("*.yaml")
                                                        if p.name != "kustomization.yaml")
    monitor = yaml.safe_load((monitoring / "podmonitor.yaml").read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    spec = monitor["spec"]
    (expression,) = spec["selector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("app.kubernetes.io/name", "In")
    assert spec["jobLabel"] == expression["key"]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    pods = {w["spec"]["template"]["metadata"]["labels"].get(expression["key"]): w["spec"]["template"]
            for w in workloads().values()}
    assert set(expression["values"]) == set(SERVICES)
    for service in SERVICES:
        pod = pods[service]
        assert pod["metadata"]["annotations"]["prometheus.io/path"] == endpoint["path"], service
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports, service
