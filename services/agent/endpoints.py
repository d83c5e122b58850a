"""A service replica's side of the node: the host ports its work serves on, and the probes of its health check.

Ports are picked free on the node (the kernel's choice for a socket bound to port 0) and remembered by the process,
so two replicas on one machine (a simulated fleet's nodes share it) are never handed the same one; a replica keeps
its ports across restarts on its allocation, so its endpoint stays where it was. Probes are plain asyncio: an HTTP
GET (status 2xx or 3xx), a TCP connect, or a command run as the work's user with its environment (exit 0); each
bounded by the check's timeout. The decisions on their results are services/agent/domain.health_step."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from libs.contracts.work import HealthCheck

_HANDED_OUT: set[int] = set()  # ports given to replicas of this process and not yet released


def pick_ports(names: list[str], host: str) -> dict[str, int]:
    """A free host port for each name (in order), none handed out to another replica of this process."""
    ports: dict[str, int] = {}
    for name in names:
        for _ in range(64):
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host or "0.0.0.0", 0))  # noqa: S104 (no address: every interface, as the work will bind)
                port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                break
        _HANDED_OUT.add(port)
        ports[name] = port
    return ports


def release_ports(ports: dict[str, int]) -> None:
    for port in ports.values():
        _HANDED_OUT.discard(port)


async def probe(check: HealthCheck, host: str, ports: dict[str, int], *, env: dict[str, str],
                uid: int | None) -> tuple[bool, str]:
    """One probe: (healthy, what it saw). An exec probe runs in / as `uid` with the work's environment."""
    try:
        return await asyncio.wait_for(_probe(check, host, ports, env=env, uid=uid), check.timeout_s)
    except TimeoutError:
        return False, f"no answer within {check.timeout_s:g}s"
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}"[:300]


async def _probe(check: HealthCheck, host: str, ports: dict[str, int], *, env: dict[str, str],
                 uid: int | None) -> tuple[bool, str]:
    if check.exec is not None:
        return await _exec(check.exec, env=env, uid=uid)
    name = check.tcp or check.port or next(iter(ports), None)
    if name is None or name not in ports:  # none given to it (yet), or gone with its allocation: unhealthy, not a crash
        return False, f"no port {name or ''} to probe".replace("  ", " ")
    port = ports[name]
    reader, writer = await asyncio.open_connection(host or "127.0.0.1", port)
    try:
        if check.tcp is not None:
            return True, f"port {name} ({port}) accepts connections"
        hostname = f"[{host}]" if ":" in host else host
        writer.write(f"GET {check.http} HTTP/1.1\r\nHost: {hostname}:{port}\r\nUser-Agent: gpupool-agent\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = (await reader.readline()).decode("latin-1").strip()
        parts = status_line.split(" ", 2)
        code = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
        return 200 <= code < 400, f"GET {check.http}: {status_line or 'no status line'}"[:300]
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _exec(argv: list[str], *, env: dict[str, str], uid: int | None) -> tuple[bool, str]:
    as_user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None and os.geteuid() == 0 else {}
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd="/", stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True, **as_user)
    try:
        code = await proc.wait()
    except asyncio.CancelledError:  # the timeout: the probe must not outlive it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    return code == 0, f"{argv[0]} exited {code}"


MAX_SCRAPE_BYTES = 1 << 20  # a metrics page larger than this is cut off (the metric sought is usually near the top)


async def scrape(host: str, port: int, path: str, timeout_s: float) -> str | None:
    """The body of `GET http://<host>:<port><path>` when it answers 200 within `timeout_s` (HTTP/1.0, so no
    chunked encoding comes back), at most MAX_SCRAPE_BYTES of it; None otherwise."""
    try:
        return await asyncio.wait_for(_scrape(host, port, path), timeout_s)
    except (TimeoutError, OSError, ValueError):
        return None


async def _scrape(host: str, port: int, path: str) -> str | None:
    reader, writer = await asyncio.open_connection(host or "127.0.0.1", port)
    try:
        hostname = f"[{host}]" if ":" in host else host
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {hostname}:{port}\r\nUser-Agent: gpupool-agent\r\n"
                     "Accept: text/plain\r\n\r\n".encode())
        await writer.drain()
        parts = (await reader.readline()).decode("latin-1").split(" ", 2)
        if len(parts) < 2 or parts[1] != "200":
            return None
        while (await reader.readline()).strip():  # the headers
            pass
        body = await reader.read(MAX_SCRAPE_BYTES)
        return body.decode("utf-8", "replace")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
