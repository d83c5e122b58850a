"""A minimal asyncio HTTP endpoint for services that have no web framework: /metrics, /healthz, /readyz.

Kept dependency-free on purpose: a worker service should not carry a web stack just to be scraped.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

ReadyCheck = Callable[[], Awaitable[bool]]


def inherited_socket(fd: int) -> socket.socket:
    """The listening socket a supervisor passed down as file descriptor `fd` (its family read from the socket)."""
    sock = socket.socket(fileno=fd)
    if sock.type != socket.SOCK_STREAM:
        raise ValueError(f"file descriptor {fd} is not a stream socket")
    sock.setblocking(False)
    return sock


class OpsEndpoint:
    def __init__(self, host: str, port: int, ready: ReadyCheck, fd: int | None = None) -> None:
        self.host = host
        self.port = port
        self.ready = ready
        self.fd = fd  # a listening socket handed down by the supervisor: serve on it, bind nothing
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        if self.fd is not None:
            self._server = await asyncio.start_server(self._handle, sock=inherited_socket(self.fd))
        else:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else "/"
            if path == "/metrics":
                status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest()
            elif path == "/healthz":
                status, ctype, body = 200, "application/json", b'{"status":"ok"}'
            elif path == "/readyz":
                ok = await self.ready()
                status = 200 if ok else 503
                ctype, body = "application/json", b'{"status":"ready"}' if ok else b'{"status":"not ready"}'
            else:
                status, ctype, body = 404, "application/problem+json", (
                    b'{"type":"about:blank","title":"Not Found","status":404}')
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
