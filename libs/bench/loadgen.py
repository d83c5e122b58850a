"""A lean HTTP/1.1 load generator for the platform benchmark.

On a 2-core machine the load generator shares the CPU with the platform it measures; a general-purpose client
(httpx) spends several milliseconds of CPU per request, which would be charged to the platform. This one keeps a
pool of keep-alive connections, writes pre-built requests and reads only the status line, the headers it needs and
the body: a fraction of that cost. JSON in, JSON out; nothing else is supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit


class HttpError(RuntimeError):
    pass


class StaleConnection(HttpError):
    """A kept-alive connection the server had closed while it sat idle: the request never reached it."""


class Connection:
    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\nConnection: keep-alive\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.answered = 0  # responses read on this connection

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def call(self, method: str, path: str, body: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(f"{method} {path} HTTP/1.1\r\n{self.head}{extra}Content-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        try:
            status_line = await self.reader.readline()
        except ConnectionResetError:
            status_line = b""
        if not status_line:
            raise StaleConnection("connection closed") if self.answered else HttpError("connection closed")
        status = int(status_line.split(b" ", 2)[1])
        length = 0
        chunked = False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip())
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            data = bytearray()
            while True:
                size = int((await self.reader.readline()).strip() or b"0", 16)
                if size == 0:
                    await self.reader.readline()
                    break
                data += await self.reader.readexactly(size)
                await self.reader.readline()
            raw = bytes(data)
        else:
            raw = await self.reader.readexactly(length) if length else b""
        self.answered += 1
        return status, (json.loads(raw) if raw else None)


class Client:
    """A pool of keep-alive connections; each call takes a free one (opening more up to `size`)."""

    def __init__(self, base_url: str, token: str, size: int = 16) -> None:
        parts = urlsplit(base_url)
        self.host, self.port, self.token = parts.hostname or "127.0.0.1", parts.port or 80, token
        self.free: asyncio.Queue[Connection] = asyncio.Queue()
        self.calls = 0  # requests sent, so the gateway's CPU can be charged per request as well as per job
        for _ in range(size):
            self.free.put_nowait(Connection(self.host, self.port, token))

    async def call(self, method: str, path: str, body: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, Any]:
        conn = await self.free.get()
        self.calls += 1
        try:
            try:
                return await conn.call(method, path, body, headers)
            except StaleConnection:  # closed by the server while idle (its keep-alive timeout): once more, afresh
                await conn.close()
                conn = Connection(self.host, self.port, self.token)
                return await conn.call(method, path, body, headers)
        except (OSError, HttpError, asyncio.IncompleteReadError, ValueError):
            await conn.close()
            conn = Connection(self.host, self.port, self.token)  # a fresh one next time
            raise
        finally:
            self.free.put_nowait(conn)

    async def close(self) -> None:
        while not self.free.empty():
            await self.free.get_nowait().close()
