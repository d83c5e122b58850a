"""What one job costs the platform, counted rather than timed: SQL statements per job per database (from
pg_stat_statements), NATS messages per job per subject (every message the server routes, seen by one `>`
subscription of the admin user: publishes, JetStream's deliveries to pull consumers, acks, requests and replies),
and request/reply round trips per job.

CPU per job is too noisy to compare on a shared machine; these counts are not: they move with the code, and only a
little with timing (how many messages a consumer's fetch brings together sets its BEGIN/COMMIT and inbox statements).
A fresh `gpupool up` (own NATS + PostgreSQL, pg_stat_statements loaded, telemetry every 5 s: the
nodes' heartbeat, seldom enough to stay a small background) runs two windows:

  idle   nothing submitted for `--idle-s` seconds: the background (cycles, relays' polls, leases) per second;
  jobs   `--jobs` one-GPU jobs through the HTTP API (as `gpupool bench platform`'s saturation phase: `--clients`
         concurrent submitters, each job completed once the queue reports it started), then until the bus has
         been quiet of job events for a second: everything the jobs caused, released and accounted included.

The jobs window's counts less the idle rate times its length, divided by the jobs, are the per-job figures.
Statements are counted whatever they are (BEGIN, SAVEPOINT and COMMIT included); a batch consumer's statements
per job fall when more jobs arrive together, so compare runs of the same `--jobs` and `--clients`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import nats

from libs.bench import benchdoc
from libs.bench.e2e import PG_PROFILE_SETTINGS, Platform, drive

BEGIN, END = "<!-- cost-counts:begin -->", "<!-- cost-counts:end -->"

PG_STATEMENTS = """
    SELECT d.datname AS db, s.query, s.calls
    FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
    WHERE d.datname LIKE 'gpupool%'"""
DELIVERED = " (delivered to a consumer)"
JOB_EVENT_PREFIXES = ("gpupool.job.", "gpupool.allocation.", "gpupool.usage.", "gpupool.decision.")


def subject_class(subject: str) -> str:
    """A subject with its per-message parts folded: replies and pull deliveries per identity's inbox, acks per
    consumer, telemetry and rollups per kind (not per node)."""
    parts = subject.split(".")
    if parts[0].startswith("_INBOX"):
        return f"{parts[0]}.*"
    if parts[0] == "$JS" and len(parts) > 4 and parts[1] == "ACK":
        return ".".join(parts[:4]) + ".*"
    if subject.startswith(("gpupool.telemetry.", "gpupool.rollup.", "gpupool.dlq.")):
        return ".".join(parts[:2]) + ".*"
    if parts[0] == "$KV":
        return ".".join(parts[:2]) + ".*"
    return subject


def database_of(name: str) -> str:
    return name.removeprefix("gpupool_")


class Counts:
    """One window's counts: statements per (database, statement text), messages per subject class."""

    def __init__(self, seconds: float, statements: Counter, messages: Counter) -> None:
        self.seconds, self.statements, self.messages = seconds, statements, messages

    def less(self, background: Counts) -> tuple[Counter, Counter]:
        """This window's counts minus the background's rate over this window's length (never below zero)."""
        k = self.seconds / max(background.seconds, 1e-9)

        def sub(a: Counter, b: Counter) -> Counter:
            return Counter({key: max(0.0, n - k * b.get(key, 0)) for key, n in a.items()})
        return sub(self.statements, background.statements), sub(self.messages, background.messages)


class Window:
    """Counts everything between `start` and `stop`: resets pg_stat_statements and subscribes to `>`."""

    def __init__(self, run: dict) -> None:
        self.run = run
        self.messages: Counter = Counter()
        self.job_event = asyncio.Event()

    async def _sql(self, sql: str) -> list:
        import asyncpg

        from libs.store.database import database_name, with_database

        dsn = with_database(self.run["postgres_admin_url"], database_name(self.run["database_urls"]["queue"]))
        conn = await asyncpg.connect(dsn)
        try:
            return list(await conn.fetch(sql))
        finally:
            await conn.close()

    async def start(self) -> None:
        await self._sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.nc = await nats.connect(servers=self.run["nats_url"].split(","), pending_size=512 * 2**20)

        async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
            # a pull consumer's delivery carries the event's own subject, and the ack subject as its reply
            delivered = (msg.reply or "").startswith("$JS.ACK.")
            self.messages[subject_class(msg.subject) + (DELIVERED if delivered else "")] += 1
            if msg.subject.startswith(JOB_EVENT_PREFIXES):
                self.job_event.set()

        await self.nc.subscribe(">", cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        await self.nc.flush()
        await self._sql("SELECT pg_stat_statements_reset()")
        self.started = time.monotonic()

    async def stop(self) -> Counts:
        seconds = time.monotonic() - self.started
        rows = await self._sql(PG_STATEMENTS)
        await self.nc.flush()
        await self.nc.close()
        statements: Counter = Counter()
        for r in rows:
            statements[(database_of(r["db"]), " ".join(r["query"].split()))] += r["calls"]
        return Counts(seconds, statements, self.messages)

    async def quiet(self, for_s: float = 1.0, limit_s: float = 60.0) -> None:
        """Until no job event has been seen for `for_s` seconds (the last release and its accounting arrived)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.job_event.clear()
            try:
                await asyncio.wait_for(self.job_event.wait(), for_s)
            except TimeoutError:
                return


async def measure(run: dict, jobs: int, clients: int, idle_s: float) -> dict:
    idle = Window(run)
    await idle.start()
    await asyncio.sleep(idle_s)
    background = await idle.stop()
    window = Window(run)
    await window.start()
    driven = await drive(run, jobs, rate=None, clients=clients, complete=True)
    await window.quiet()
    counted = await window.stop()
    statements, messages = counted.less(background)
    admitted = max(driven["admitted"], 1)
    return {
        "jobs": jobs, "admitted": driven["admitted"], "clients": clients, "window_s": round(counted.seconds, 2),
        "idle_s": round(background.seconds, 2), "http_requests_per_job": driven["http_requests"] / admitted,
        "statements": [{"db": db, "query": q, "per_job": n / admitted} for (db, q), n in statements.items()],
        "messages": {s: n / admitted for s, n in messages.items()},
        "background_per_s": {"statements": sum(background.statements.values()) / background.seconds,
                             "messages": sum(background.messages.values()) / background.seconds},
    }


def median_of(results: list[dict]) -> dict:
    """Several runs' results as one: each statement's and each subject's per-job figure the median over the runs (a
    run that did not see it counts 0); the rest from the first run, with the admitted jobs summed."""
    if len(results) == 1:
        return results[0]
    keys = {(s["db"], s["query"]) for r in results for s in r["statements"]}
    per = [{(s["db"], s["query"]): s["per_job"] for s in r["statements"]} for r in results]
    subjects = {k for r in results for k in r["messages"]}
    return results[0] | {
        "runs": len(results), "admitted": sum(r["admitted"] for r in results),
        "statements": [{"db": db, "query": q, "per_job": statistics.median(p.get((db, q), 0.0) for p in per)}
                       for db, q in sorted(keys)],
        "messages": {k: statistics.median(r["messages"].get(k, 0.0) for r in results) for k in sorted(subjects)}}


def summary(result: dict) -> dict:
    """Per database: statements, commits and inbox statements per job; per subject: messages per job; round trips."""
    per_db: dict[str, dict[str, float]] = {}
    for s in result["statements"]:
        row = per_db.setdefault(s["db"], {"statements": 0.0, "commits": 0.0, "inbox": 0.0, "rest": 0.0})
        query, n = s["query"].upper(), s["per_job"]
        row["statements"] += n
        row["commits"] += n if query.startswith("COMMIT") else 0.0
        row["inbox"] += n if "INBOX" in query else 0.0
        # what does not depend on how messages batch: all but transaction control and the inbox
        row["rest"] += 0.0 if query.startswith(("BEGIN", "COMMIT", "ROLLBACK")) or "INBOX" in query else n
    msgs = result["messages"]
    rpc = {s: n for s, n in msgs.items() if s.startswith(("gpupool.cmd.", "gpupool.query."))}
    events = {s: n for s, n in msgs.items() if s.startswith("gpupool.") and s not in rpc}
    return {"per_db": per_db, "rpc": rpc,
            "events": {s: n for s, n in events.items() if not s.endswith(DELIVERED)},
            "deliveries": {s.removesuffix(DELIVERED): n for s, n in events.items() if s.endswith(DELIVERED)},
            "jetstream": {s: n for s, n in msgs.items() if s.startswith("$")},
            "inboxes": {s: n for s, n in msgs.items() if s.startswith("_INBOX")}}


def comparison(before: dict, after: dict, label: str) -> list[str]:
    """Per database and per subject, `before` (an earlier run's `--json`, `label` says which) beside this run."""
    b, a = summary(before), summary(after)
    f = lambda x: f"{x:.2f}"  # noqa: E731
    lines = [f"### Against {label}", "", f"Per job, {before['admitted']} jobs then, {after['admitted']} now "
             "(statements that depend on how messages batch, BEGIN/COMMIT and the inbox's, move a little from run "
             "to run; the rest moves much less: of it, only the outbox relay's few statements per published batch do).", "",
             "| database | statements before | after | commits before | after | the rest before | after |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    keys = ("statements", "commits", "rest")
    zero = dict.fromkeys(keys, 0.0)
    for db in sorted(set(b["per_db"]) | set(a["per_db"])):
        x, y = b["per_db"].get(db, zero), a["per_db"].get(db, zero)
        lines.append(f"| {db} | " + " | ".join(f"{f(x[k])} | {f(y[k])}" for k in keys) + " |")
    total = lambda s, k: sum(r[k] for r in s["per_db"].values())  # noqa: E731
    lines += ["| **all** | " + " | ".join(f"**{f(total(b, k))}** | **{f(total(a, k))}**" for k in keys) + " |", "",
              "| messages per job | before | after |", "| --- | --- | --- |"]
    for kind, title in (("rpc", "request/reply round trips"), ("events", "events published"),
                        ("deliveries", "deliveries to durable consumers"), ("jetstream", "JetStream API and acks"),
                        ("inboxes", "replies and pull deliveries")):
        lines.append(f"| {title} | {f(sum(b[kind].values()))} | {f(sum(a[kind].values()))} |")
    return lines + [""]


def markdown(result: dict, command: str, top: int = 40, before: dict | None = None,
             before_label: str = "") -> str:
    s = summary(result)
    f = lambda x: f"{x:.2f}"  # noqa: E731
    up = "`gpupool up`" if result.get("durable") else "`gpupool up --unsafe-fast`"
    n = result.get("runs", 1)
    runs = f"{n} fresh {up} (per-job figures: medians over them)" if n > 1 else f"a fresh {up}"
    first = " in the first run" if n > 1 else ""
    lines = [BEGIN, "## What one job costs, counted (`gpupool bench counts`)", "",
             f"`{command}` — {runs} with pg_stat_statements, telemetry every 5 s; "
             f"{result['jobs']} one-GPU jobs from {result['clients']} concurrent clients through the HTTP API, "
             f"each completed once started, counted until released and accounted ({result['window_s']} s{first}), "
             f"less the background of an idle window of {result['idle_s']} s "
             f"({result['background_per_s']['statements']:.1f} statements/s, "
             f"{result['background_per_s']['messages']:.1f} messages/s). Machine: {benchdoc.machine()}.", "",
             "| database | statements per job | commits per job | inbox statements per job | the rest: not BEGIN, "
             "COMMIT or inbox |", "| --- | --- | --- | --- | --- |"]
    keys = ("statements", "commits", "inbox", "rest")
    for db in sorted(s["per_db"]):
        lines.append(f"| {db} | " + " | ".join(f(s["per_db"][db][k]) for k in keys) + " |")
    lines += ["| **all** | " + " | ".join(f"**{f(sum(r[k] for r in s['per_db'].values()))}**" for k in keys) + " |",
              ""]
    if before is not None:
        lines += comparison(before, result, before_label)

    def table(title: str, rows: dict[str, float]) -> None:
        nonlocal lines
        lines += [f"| {title} | per job |", "| --- | --- |"]
        lines += [f"| `{k}` | {f(v)} |" for k, v in sorted(rows.items(), key=lambda kv: -kv[1]) if v >= 0.005]
        lines += [f"| **all** | **{f(sum(rows.values()))}** |", ""]

    table("request/reply round trips (subject)", s["rpc"])
    table("events published (subject)", s["events"])
    table("events delivered to durable consumers (subject)", s["deliveries"])
    table("JetStream API and acks (subject)", s["jetstream"])
    table("replies and pull deliveries (inbox)", s["inboxes"])
    stmts = sorted(result["statements"], key=lambda x: -x["per_job"])[:top]
    lines += [f"The {len(stmts)} most frequent statements:", "", "| database | per job | statement |",
              "| --- | --- | --- |"]
    for st in stmts:
        q = st["query"][:150].replace("|", "\\|")
        lines.append(f"| {st['db']} | {f(st['per_job'])} | `{q}` |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench counts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300, help="one-GPU jobs submitted (default 300)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent submitters (default 8)")
    parser.add_argument("--runs", type=int, default=1, help="fresh platforms to count on (medians; default 1)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="the idle window measuring the background")
    parser.add_argument("--durable", action="store_true", help="PostgreSQL with fsync on (counts do not change)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw counts here")
    parser.add_argument("--compare", type=Path, default=None, metavar="JSON",
                        help="an earlier run's --json: its figures beside this run's, per database and per kind")
    parser.add_argument("--compare-label", default="the earlier run", help="what --compare's run was (a commit)")
    parser.add_argument("--write", type=Path, nargs="?", const=Path("docs/benchmarks.md"), default=None,
                        metavar="FILE", help="replace this section of FILE (default docs/benchmarks.md)")
    args = parser.parse_args(argv)
    extra = PG_PROFILE_SETTINGS + ("--telemetry-interval", "5") + (() if args.durable else ("--unsafe-fast",))
    results = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpupool-counts-") as tmp, \
                Platform(Path(tmp), extra=extra) as platform:
            time.sleep(3)  # registrations and the first cycles settle before the idle window
            results.append(asyncio.run(measure(platform.run, args.jobs, args.clients, args.idle_s)))
    result = median_of(results) | {"durable": args.durable}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    command = "gpupool bench counts " + shlex.join(argv if argv is not None else sys.argv[1:])
    before = json.loads(args.compare.read_text()) if args.compare else None
    text = markdown(result, command.strip(), before=before, before_label=args.compare_label)
    if args.write:
        benchdoc.write_section(args.write, BEGIN, END, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
