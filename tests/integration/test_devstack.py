"""The dev/test servers are real: JetStream deduplicates, PostgreSQL stores and survives restarts, stop() stops."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import asyncpg
import nats
import pytest

from libs.devstack.servers import ServerStartError, start_nats, start_postgres

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (postgres backends, checkpointer, ...), read from /proc."""
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                kids.append(int(entry.name))
    return kids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # zombie
    except (ProcessLookupError, FileNotFoundError):
        return True


async def test_jetstream_reports_a_second_publish_with_the_same_msg_id_as_a_duplicate(
    nats_url: str, clean_jetstream: None
) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="DEDUP", subjects=["dedup.>"], duplicate_window=60)
        first = await js.publish("dedup.a", b"x", headers={"Nats-Msg-Id": "job-1"})
        second = await js.publish("dedup.a", b"x", headers={"Nats-Msg-Id": "job-1"})
        assert not first.duplicate  # nats-py leaves it None when the server omits "duplicate": false
        assert second.duplicate is True
        assert second.seq == first.seq
        assert (await js.stream_info("DEDUP")).state.messages == 1
    finally:
        await nc.close()


@pytest.mark.parametrize("round_", [1, 2])
async def test_every_test_starts_with_no_streams(nats_url: str, clean_jetstream: None, round_: int) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        assert await js.streams_info() == []
        await js.add_stream(name="LEFTOVER", subjects=["leftover.>"])  # the next round must not see it
    finally:
        await nc.close()


async def test_a_fresh_database_is_empty_and_stores_and_returns_rows(pg_database: str) -> None:
    conn = await asyncpg.connect(pg_database)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        await conn.execute("CREATE TABLE jobs (id int PRIMARY KEY, name text NOT NULL)")
        await conn.executemany("INSERT INTO jobs VALUES ($1, $2)", [(1, "train"), (2, "eval")])
        rows = await conn.fetch("SELECT id, name FROM jobs ORDER BY id")
        assert [tuple(r) for r in rows] == [(1, "train"), (2, "eval")]
    finally:
        await conn.close()


async def test_postgres_keeps_its_data_across_a_restart_on_the_same_data_dir(tmp_path: Path) -> None:
    server = start_postgres(tmp_path / "pg")
    try:
        conn = await asyncpg.connect(server.url)
        await conn.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')")
        await conn.close()
        children = _children(server.pid)
        assert children, "a running postmaster has background processes"
        server.stop()
        assert not server.is_running()
        assert _gone(server.pid) and all(_gone(c) for c in children)

        server = start_postgres(tmp_path / "pg")
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT v FROM kept") == "still here"
        await conn.close()
    finally:
        server.stop()


async def test_postgres_starts_again_after_being_killed_without_a_clean_shutdown(tmp_path: Path) -> None:
    server = start_postgres(tmp_path / "pg")
    os.kill(server.pid, signal.SIGKILL)
    server._proc.wait()
    assert (tmp_path / "pg" / "postmaster.pid").exists(), "the killed server leaves its lock file behind"

    server = start_postgres(tmp_path / "pg")
    try:
        conn = await asyncpg.connect(server.url)
        assert await conn.fetchval("SELECT 1") == 1
        await conn.close()
    finally:
        server.stop()


def test_a_second_postgres_on_a_data_dir_in_use_is_refused_clearly(tmp_path: Path) -> None:
    server = start_postgres(tmp_path / "pg")
    try:
        with pytest.raises(ServerStartError, match=rf"\(pid {server.pid}\) is already running"):
            start_postgres(tmp_path / "pg")
        assert server.is_running()
    finally:
        server.stop()


def test_stop_ends_the_nats_server_process(tmp_path: Path) -> None:
    server = start_nats(tmp_path / "nats")
    assert server.is_running()
    server.stop()
    assert not server.is_running()
    assert _gone(server.pid)
    server.stop()  # stopping twice is harmless


def test_a_nats_server_that_cannot_start_raises_with_the_tail_of_its_log(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("jetstream { this is not valid\n")
    with pytest.raises(ServerStartError, match=r"nats exited .*\n.*Parse error on line 1"):
        start_nats(tmp_path / "nats", config_file=bad)
