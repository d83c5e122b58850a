"""The benchmark's HTTP client against a real socket server: keep-alive connections the server closed."""

from __future__ import annotations

import asyncio

import pytest

from libs.bench.loadgen import Client, HttpError

pytestmark = pytest.mark.asyncio


async def serve(answers_per_connection: int) -> tuple[asyncio.Server, list[bytes]]:
    """A server that answers `answers_per_connection` requests on a connection, then closes it (a keep-alive
    timeout seen from the client); it records each request line."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(answers_per_connection):
            line = await reader.readline()
            if not line:
                break
            seen.append(line.strip())
            length = 0
            while (header := await reader.readline()) not in (b"\r\n", b""):
                if header.lower().startswith(b"content-length:"):
                    length = int(header.split(b":")[1])
            await reader.readexactly(length)
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"ok":true}')
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


async def test_a_kept_alive_connection_the_server_closed_is_reopened_and_the_request_sent_once_more() -> None:
    server, seen = await serve(answers_per_connection=1)
    port = server.sockets[0].getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}", "t", size=1)
    try:
        assert await client.call("POST", "/v1/jobs/a/complete") == (200, {"ok": True})
        await asyncio.sleep(0.05)  # the server has closed the idle connection
        assert await client.call("POST", "/v1/jobs/b/complete") == (200, {"ok": True})
        assert seen == [b"POST /v1/jobs/a/complete HTTP/1.1", b"POST /v1/jobs/b/complete HTTP/1.1"]
    finally:
        await client.close()
        server.close()


async def test_a_fresh_connection_closed_without_an_answer_is_an_error_not_a_resend() -> None:
    server, seen = await serve(answers_per_connection=0)
    port = server.sockets[0].getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}", "t", size=1)
    try:
        with pytest.raises(HttpError):
            await client.call("POST", "/v1/jobs/a/complete")
        assert seen == []
    finally:
        await client.close()
        server.close()
