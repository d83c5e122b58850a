"""deploy/prometheus/rules: the alert rules (gpupool.yml) and the recording rules joining the GPUs' DCGM series with
the work on them (gpu_jobs.yml) pass `promtool check rules`, their unit tests pass `promtool test rules` (and a
broken rule fails them), they query only metrics gpupool defines, and every deployment loads them.

Reproduce: `promtool check rules deploy/prometheus/rules/gpupool.yml deploy/prometheus/rules/gpu_jobs.yml` and
`promtool test rules deploy/prometheus/rules/*_test.yml` (Debian's `prometheus` package ships promtool).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ecosystem import debian_tool
from tests.unit.deploy.test_dashboards import defined_metrics, expressions, metric_names
from tests.unit.deploy.test_kubernetes import SERVICES, workloads

ROOT = Path(__file__).resolve().parents[3]
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "gpupool.yml"
GPU_JOBS = RULES_DIR / "gpu_jobs.yml"
RULE_FILES = {RULES: 8, GPU_JOBS: 1}  # each rules file with its number of rules
REQUIRED_ALERTS = {  # what issue 20 asks the rules to cover
    "GpupoolConsumerLagging": "consumer lag", "GpupoolDeadLettersGrowing": "DLQ growth",
    "GpupoolSchedulerStalled": "scheduler stalled", "GpupoolGpuQuarantined": "GPU quarantined",
    "GpupoolNodeLost": "node lost", "GpupoolIdleAllocationsHigh": "idle allocations above a share",
    "GpupoolQuotaExhausted": "quota exhausted",
}
REQUIRED_RECORDS = {"gpupool:gpu_utilization:avg_by_team": "GPU utilisation per team (DCGM joined with the jobs)"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([debian_tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def groups() -> list[dict]:
    return [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]


def rules(path: Path | None = None) -> list[dict]:
    found = groups() if path is None else yaml.safe_load(path.read_text())["groups"]
    return [r for group in found for r in group["rules"]]


def test_every_rules_file_is_known_and_promtool_checks_it() -> None:
    assert set(RULE_FILES) == {p for p in RULES_DIR.glob("*.yml") if not p.stem.endswith("_test")}
    for path, count in RULE_FILES.items():
        assert len(rules(path)) == count, path.name
        done = promtool("check", "rules", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"SUCCESS: {count} rules found" in done.stdout


def test_promtool_runs_the_rules_unit_tests() -> None:
    tests = sorted(RULES_DIR.glob("*_test.yml"))
    assert [t.name for t in tests] == sorted(f"{path.stem}_test.yml" for path in RULE_FILES)  # each file tested
    done = promtool("test", "rules", *map(str, tests))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(tests), done.stdout


def test_a_changed_threshold_fails_the_rules_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests against rules whose lag threshold moved from 1000 to 10000."""
    (tmp_path / "gpupool.yml").write_text(RULES.read_text().replace("gpupool_bus_consumer_pending) > 1000",
                                                                    "gpupool_bus_consumer_pending) > 10000"))
    shutil.copy(RULES_DIR / "gpupool_test.yml", tmp_path / "gpupool_test.yml")
    done = promtool("test", "rules", str(tmp_path / "gpupool_test.yml"))
    assert done.returncode != 0 and "GpupoolConsumerLagging" in done.stdout + done.stderr


@pytest.mark.parametrize(("broken", "fails"), [
    # each GPU of a team once: without the max over the team's allocations, g3 (two research fractions) counts twice
    ("max by (Hostname, UUID, team) (gpupool_gpu_allocation_info)", "gpupool_gpu_allocation_info"),
    # one utilisation per GPU: without it, g0 (served by the agent and by dcgm-exporter) is a duplicate match
    ("max by (Hostname, UUID) (DCGM_FI_DEV_GPU_UTIL)", "DCGM_FI_DEV_GPU_UTIL"),
])
def test_a_broken_join_fails_the_recording_rule_unit_tests(tmp_path: Path, broken: str, fails: str) -> None:
    text = GPU_JOBS.read_text()
    assert broken in text
    (tmp_path / GPU_JOBS.name).write_text(text.replace(broken, fails))
    shutil.copy(RULES_DIR / "gpu_jobs_test.yml", tmp_path / "gpu_jobs_test.yml")
    done = promtool("test", "rules", str(tmp_path / "gpu_jobs_test.yml"))
    assert done.returncode != 0 and "gpupool:gpu_utilization:avg_by_team" in done.stdout + done.stderr


def test_the_recording_rules_the_issue_asks_for_are_tested() -> None:
    records = {r["record"] for r in rules() if "record" in r}
    assert set(REQUIRED_RECORDS) <= records
    tested = yaml.safe_load((RULES_DIR / "gpu_jobs_test.yml").read_text())
    checks = [t for case in tested["tests"] for t in case.get("promql_expr_test", [])]
    assert (len(tested["tests"]), len(checks), sum(len(t["exp_samples"]) for t in checks)) == (1, 2, 4)  # the docs'
    assert records <= {t["expr"] for t in checks}


def test_the_rules_cover_what_the_issue_asks_with_severity_and_summary() -> None:
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert set(REQUIRED_ALERTS) <= set(alerts)
    for rule in alerts.values():
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]


def test_the_rules_query_only_metrics_gpupool_defines() -> None:
    defined = defined_metrics()
    for rule in rules():
        name = rule.get("alert") or rule["record"]
        names = metric_names(rule["expr"])
        assert names, name
        assert names <= defined, (name, names - defined)


def test_compose_prometheus_loads_the_rules_file_it_mounts() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == [f"/etc/prometheus/rules/{path.name}" for path in RULE_FILES]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./deploy/prometheus/rules:/etc/prometheus/rules:ro" in compose["services"]["prometheus"]["volumes"]


def test_the_operators_prometheusrule_holds_exactly_the_rules_files() -> None:
    rule = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == {"groups": groups()}, (
        "deploy/kubernetes/monitoring/prometheusrule.yaml differs from deploy/prometheus/rules/gpupool.yml then "
        "gpu_jobs.yml: copy the groups over")


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


def test_the_per_team_panels_give_the_figures_of_the_rules_unit_tests(tmp_path: Path) -> None:
    """The reclamation-and-waste dashboard's per-team panels, their Grafana variables set (all nodes and models, idle
    below 15 %), evaluated by promtool over gpu_jobs_test.yml's input series: utilisation per team as the recording
    rule's tests expect, and research's g1 (10 %) as its one allocated-but-idle GPU."""
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "gpupool-reclamation-waste.json").read_text())
    exprs = {title: expr for title, expr in expressions(board)}
    variables = {"$hostname": ".*", "$model": ".*", "$idle_pct": "15"}
    util, idle = (exprs[title] for title in ("GPU utilisation per team", "Allocated-but-idle GPUs per team"))
    for name, value in variables.items():
        idle = idle.replace(name, value)
    assert "$" not in util + idle
    (case,) = yaml.safe_load((RULES_DIR / "gpu_jobs_test.yml").read_text())["tests"][:1]
    tests = [{"expr": util, "eval_time": "2m", "exp_samples": [
                 {"labels": f'gpupool:gpu_utilization:avg_by_team{{team="{team}"}}', "value": value}
                 for team, value in (("research", 45), ("serving", 65))]},
             {"expr": idle, "eval_time": "2m", "exp_samples": [{"labels": '{team="research"}', "value": 1}]}]
    (tmp_path / "panels_test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(GPU_JOBS)], "evaluation_interval": "1m",
        "tests": [{"name": "per-team panels", "interval": "1m", "input_series": case["input_series"],
                   "promql_expr_test": tests}]}))
    done = promtool("test", "rules", str(tmp_path / "panels_test.yml"))
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
