"""Turning placement's read model into the core's snapshot and policy, and core placements into events."""

from __future__ import annotations

import dataclasses
import ipaddress
import operator
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from itertools import chain
from operator import itemgetter
from typing import Any

from libs.contracts.events import (
    AllocatedGpu,
    DecidedPlacement,
    DecidedPreemption,
    GpuSpec,
    SchedulingCycleDecided,
)
from libs.contracts.fleet import BLOCK_LABEL, RACK_LABEL
from libs.contracts.reasons import MAX_LISTED, PendingFacts, PreemptionWait, QuotaRefusal, Victim
from libs.contracts.work import ISOLATION_LABEL_PREFIX
from libs.core import (
    DEFAULT_PRIORITY_CLASSES,
    Allocation,
    Gpu,
    JobRequest,
    MigInstance,
    Node,
    PendingReason,
    Placement,
    Plan,
    Policy,
    PriorityClass,
    QuotaEntry,
    QuotaTree,
    Share,
    Snapshot,
    UsageRecord,
    WorkloadShape,
    workload_from_counts,
)
from libs.core import mig as migcat
from libs.core.objmemo import ByObject
from libs.core.plan import ReasonFacts
from libs.core.reasons import NO_NODE_MATCHES_SELECTOR

Row = Mapping[str, Any]

# The label a node's agent registers for each isolation driver it can run (services/agent/domain.py writes it).
# What `explain` shows for a job whose work's isolation no schedulable node offers (the core's reason, made specific).
NO_NODE_OFFERS_ISOLATION = "NoNodeOffersIsolation"


def gather_wait(kicked_while_busy: bool, last_cycle_s: float, floor_s: float, cap_s: float) -> float:
    """How long the scheduling loop lets events gather after a wake. One that came while the last cycle ran means
    changes arrive faster than cycles: wait as long as that cycle took (capped), so cycles use at most about half of
    the time and each handles more jobs. One that found the loop idle is a lone change — a freed GPU whose next job
    waits — or a burst's first: only the floor (at fleet size, waiting a ~100 ms cycle's length there added 50 ms
    to every turnover)."""
    return max(floor_s, min(last_cycle_s, cap_s)) if kicked_while_busy else floor_s


def unit_id(job_id: str, replica: int, replica_set: bool) -> str:
    """What the core schedules: a whole job (single or gang), or one replica of a replica set (a service)."""
    return f"{job_id}#{replica}" if replica_set else job_id


def is_replica_set(row: Row) -> bool:
    """A pending_jobs row (or an allocation joined with it) of a replica set: its bounds let it scale, or it has
    more than one replica."""
    return bool(row.get("replica_set")) or row.get("replicas", 1) > 1


def split_unit(unit: str) -> tuple[str, int | None]:
    job_id, sep, replica = unit.partition("#")
    return job_id, (int(replica) if sep else None)


def nvlink_domains(gpus: Iterable[GpuSpec]) -> dict[int, str]:
    """GPU index → its NVLink domain on the node: the GPUs it reaches over NVLink, directly or through a peer (an
    NVSwitch baseboard: all of them; bridged pairs: its pair), named `nv<lowest index>`; '' without a peer."""
    gpus = list(gpus)
    known = {g.index for g in gpus}
    root = {i: i for i in known}

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for g in gpus:
        for peer in g.nvlink_peers:
            if peer in known and peer != g.index:
                a, b = find(g.index), find(peer)
                root[max(a, b)] = min(a, b)
    sizes: dict[int, int] = defaultdict(int)
    for i in known:
        sizes[find(i)] += 1
    return {i: f"nv{find(i)}" if sizes[find(i)] > 1 else "" for i in known}


def node_topology(labels: Mapping[str, str]) -> str:
    """The core's topology domain of a node from its labels: `block/rack` (a rack is named within its block), the
    rack or the block alone, or '' when the node says neither."""
    return "/".join(v for v in (labels.get(BLOCK_LABEL, ""), labels.get(RACK_LABEL, "")) if v)


class SnapshotMemo:
    """The core's Node and Allocation objects of the last cycle's snapshot, by node and allocation: a row unchanged
    since gives the same object again, so a cycle builds only what changed and whatever compares or encodes the
    snapshot (the kept scheduler, the decision encoder) meets the same objects."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[str, str], tuple[Row, list[Row], frozenset, Node]] = {}
        self.running = ByObject(_allocation)  # live allocation row -> its Allocation
        self._gpus: tuple[list[Row], set[str], dict[str, str]] = ([], set(), {})  # rows, draining, modes
        self._misfits = ByObject()  # live allocation row -> the GPUs it closes (while no GPU row changed)
        self._last: tuple | None = None  # the last snapshot's node rows, GPU rows, closed GPUs and nodes

    def closed_gpus(self, gpus: list[Row], running: list[Row]) -> set[str]:
        """`closed_gpus(gpus, running)`, looking again only at the rows that changed: while every GPU row is the
        one it was last time (the pool and live allocations are read only where they changed, `WantedJobs`), a
        live allocation's row closes the GPUs it closed then."""
        if not _same_rows(gpus, self._gpus[0]):
            self._gpus = (gpus, {g["uuid"] for g in gpus if g.get("draining")}, {g["uuid"]: g["sharing"] for g in gpus})
            self._misfits = ByObject()
        _, closed, mode = self._gpus
        return closed.union(chain.from_iterable(self._misfits.of(running, lambda r: misfit_gpus(r, mode))))

    def nodes_of(self, nodes: list[Row], gpus: list[Row], closed: set[str]) -> tuple[Node, ...]:
        """The snapshot's nodes: the last snapshot's tuple whole when the node and GPU rows are the very same and
        the same GPUs are closed (nothing a `Node` is made of changed), else built again (`_nodes`)."""
        last = self._last
        if last is not None and _same_rows(nodes, last[0]) and _same_rows(gpus, last[1]) and closed == last[2]:
            return last[3]
        built = _nodes(nodes, gpus, closed, self)
        self._last = (nodes, gpus, closed, built)
        return built


def _same_rows(a: list[Row], b: list[Row]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def build_snapshot(nodes: Iterable[Row], gpus: Iterable[Row], running: Iterable[Row],
                   usage: Iterable[Row] = (), memo: SnapshotMemo | None = None) -> Snapshot:
    """MIG is dynamic here: a GPU in MIG mode has exactly the instances live allocations hold (the agent creates
    an instance with its grant and destroys it with its release), so every other slot is free to plan. A GPU
    whose NUMA node is unknown gets -1 (one group of its own). `usage`: each team's decayed GPU-seconds per model
    (`team_usage`), fair share's history. `memo`: reuse the objects of rows unchanged since its last snapshot. A
    node row with `gpus` (the cycle's read) has its GPUs there; other nodes' are taken from `gpus`."""
    running = running if isinstance(running, list) else list(running)
    gpus = gpus if isinstance(gpus, list) else list(gpus)
    nodes = nodes if isinstance(nodes, list) else list(nodes)
    memo = memo or SnapshotMemo()
    closed = memo.closed_gpus(gpus, running)
    return Snapshot(
        nodes=memo.nodes_of(nodes, gpus, closed),
        running=tuple(memo.running.of(running)),
        usage=tuple(UsageRecord(team=u["team"], gpu_model=u["gpu_model"], gpu_seconds=u["gpu_seconds"],
                                as_of=u["as_of"].timestamp()) for u in usage),
    )


def _nodes(nodes: list[Row], gpus: list[Row], closed: set[str], memo: SnapshotMemo) -> tuple[Node, ...]:
    """Each node row's `Node` (the last one's where nothing it is made of changed)."""
    rows: dict[tuple[str, str], list[Row]] | None = None
    built_nodes = {}
    for n in nodes:
        key = (n["cluster"], n["node"])
        mine = n.get("gpus")  # the cycle's read gives each node with its GPUs (`gpus` lists the same rows)
        if mine is None:
            if rows is None:
                rows = defaultdict(list)
                for g in gpus:
                    rows[(g["cluster"], g["node"])].append(g)
            mine = rows[key]
        shut = frozenset(g["uuid"] for g in mine if g["uuid"] in closed) if closed else frozenset()
        hit = memo.nodes.get(key)
        if hit is None or (hit[0] is not n and hit[0] != n) or hit[1] != mine or hit[2] != shut:
            hit = (n, mine, shut, _node(n, mine, shut))
        built_nodes[key] = hit
    memo.nodes = built_nodes
    return tuple(v[3] for v in built_nodes.values())


def _node(n: Row, gpus: list[Row], closed: frozenset) -> Node:
    labels = n.get("labels") or {}
    return Node(name=n["node"], cluster=n["cluster"], gpus=tuple(
        Gpu(uuid=g["uuid"], index=g["idx"], model=g["model"], memory_mib=g["memory_mib"],
            healthy=g["health"] == "healthy" and g["uuid"] not in closed, sharing=g["sharing"],
            nvlink_domain=g.get("nvlink_domain") or "", numa_node=-1 if g.get("numa_node") is None else g["numa_node"])
        for g in gpus),
        schedulable=n["schedulable"], labels=tuple(sorted(labels.items())), topology=node_topology(labels),
        cpu_milli=n.get("cpu_milli") or 0, memory_mib=n.get("memory_mib") or 0)


def _allocation(r: Row) -> Allocation:
    return Allocation(job_id=unit_id(r["job_id"], r["replica"], is_replica_set(r)), team=r["team"], node=r["node"],
                      gpu_uuids=tuple(r["gpu_uuids"]), started_at=r["granted_at"].timestamp(),
                      project=r["project"], priority=r["priority"], priority_class=r["priority_class"],
                      gpu_model=r["gpu_model"] or "", max_runtime_s=r["max_runtime_s"],
                      # an allocation already being preempted is on its way out: never pick it again; else
                      # the job's own word (None: its class and kind decide)
                      preemptible=False if r["preempt_deadline"] is not None else r.get("preemptible"),
                      cpu_milli=r.get("cpu_milli") or 0, memory_mib=r.get("memory_mib") or 0,
                      kind=r["kind"] or "", replica_group=r["job_id"] if is_replica_set(r) else "",
                      **_held_share(r))


def recent_workload(shapes: Iterable[Row], limit: int = 32) -> tuple[WorkloadShape, ...]:
    """The workload the live fragmentation measure is taken against: the job shapes recently asked for, by the
    rule the scheduler and the simulator use (`libs.core.workload_from_counts`: the `limit` most frequent, each
    weighted by how often it occurred). A shape row: GPUs on one node, share of each GPU (milli), allowed models,
    MIG profile, count; the rows carry no host CPU or memory."""
    counts: dict[tuple, float] = {}
    for r in shapes:
        if r["gpus"] <= 0:
            continue
        key = (min(r["gpus"], 8), r["share_milli"], tuple(sorted(r["models"])), r["mig_profile"])
        counts[key] = counts.get(key, 0) + r["n"]
    return workload_from_counts(counts, limit)


def queue_order(pending: Iterable[PendingReason]) -> tuple[str, ...]:
    """The waiting jobs in the order the cycle tried them (the core lists a plan's pending reasons in that order:
    priority, then fair share, then submit time), each job once: what `explain` reports as its position."""
    return tuple(dict.fromkeys(split_unit(r.job_id)[0] for r in pending))


def order_still_holds(written: tuple[str, ...] | None, order: tuple[str, ...], waits: Callable[[str], bool]) -> bool:
    """Whether the stored order `written` still gives every job of `order` its position: `order` is `written`
    without some jobs, none of which `waits` any more (placed, finished). `explain` counts only the jobs still
    waiting ahead, so a turnover (the head job placed, nothing new) need not write 10,000 ids again."""
    if written is None or len(order) > len(written):
        return False
    rest, gone = iter(written), []
    for job in order:
        for w in rest:
            if w == job:
                break
            gone.append(w)
        else:
            return False
    gone.extend(rest)
    return not any(map(waits, gone))


def closed_gpus(gpus: Iterable[Row], running: Iterable[Row]) -> set[str]:
    """GPUs that take no new work this cycle: one draining for a new sharing mode, and one whose live work does
    not fit its mode (a mode changed while work was held: MIG slices on a GPU no longer in `mig`, a fraction on an
    `exclusive` one, a whole GPU held on a `mig` one). Offering such a GPU made the core plan what the store then
    refused, cycle after cycle."""
    closed = {g["uuid"] for g in gpus if g.get("draining")}
    mode = {g["uuid"]: g["sharing"] for g in gpus}
    for r in running:
        closed.update(misfit_gpus(r, mode))
    return closed


def misfit_gpus(r: Row, mode: Mapping[str, str]) -> tuple[str, ...]:
    """The GPUs a live allocation's row holds in a way their sharing mode (`mode`: uuid -> mode) does not allow."""
    share = "mig" if any(p is not None for p in r["mig_profiles"]) else (
        "fraction" if r["share_milli"] < 1000 else "whole")
    return tuple(u for u in r["gpu_uuids"] if ((m := mode.get(u)) == "mig") != (share == "mig")
                 or (m == "exclusive" and share == "fraction"))


def _held_share(r: Row) -> dict[str, Any]:
    """What a running allocation holds of its GPUs, in the core's terms."""
    mig = tuple((u, MigInstance(p, s)) for u, p, s in zip(r["gpu_uuids"], r["mig_profiles"], r["mig_starts"],
                                                          strict=True) if p is not None)
    if mig:
        return {"mig": mig}
    if r["share_milli"] < 1000:
        return {"gpu_fraction_milli": r["share_milli"], "gpu_memory_mib": r["gpu_memory_mib"] or 0}
    return {}


def offered_models(gpus: Iterable[Row]) -> dict[str, set[str]]:
    """Sharing mode → GPU models that healthy GPUs in that mode have (what a dev job's default can use)."""
    out: dict[str, set[str]] = defaultdict(set)
    for g in gpus:
        if g["health"] == "healthy" and not g.get("draining"):
            out[g["sharing"]].add(g["model"])
    return out


def live_facts(running: Iterable[Row]) -> tuple[dict[str, set[int]], datetime | None, set[str]]:
    """From the live allocations, in one pass: the replicas each job holds, the earliest preemption deadline
    (None: none is being preempted) and the units whose victims are being preempted for them. The plain form the
    cycle's `incremental.LiveTally` (kept from each read's change) is checked against."""
    live: dict[str, set[int]] = defaultdict(set)
    deadline, waiting = None, set()
    for r in running:
        live[r["job_id"]].add(r["replica"])
        at = r["preempt_deadline"]
        if at is not None:
            waiting.add(r["preempted_by"])
            if deadline is None or at < deadline:
                deadline = at
    return live, deadline, waiting


def dev_share(row: Row, offered: Mapping[str, set[str]], fraction_milli: int,
              memory_mib: int) -> dict[str, Any]:
    """A dev job that asks for one GPU and names no share gets every share the pool offers, in this order: a
    fraction on a fractional GPU of an allowed model, then the smallest MIG slice with `memory_mib` of each MIG
    model (by name), then, the last resort, a whole GPU. The first is the request, the others its `alternatives`:
    the core tries them in order when the one before is not placed now, so a session runs on a MIG slice while
    every fractional GPU is full, and takes a whole GPU only when no share has room. A job that says `exclusive`
    (or a pool offering no share) gets a whole GPU. Interactive sessions rarely use a whole card; this is where the
    pool's idle capacity goes back."""
    if (row["kind"] != "dev" or row["gpus"] != 1 or row["gang_nodes"] or row["exclusive"]
            or row["gpu_fraction_milli"] or row["mig_profile"]):
        return {}
    models = tuple(row["gpu_models"])
    allowed = set(models)
    shares: list[Share] = []
    if any(not allowed or m in allowed for m in offered.get("fractional", ())):
        shares.append(Share(gpu_fraction_milli=fraction_milli, gpu_memory_mib=memory_mib, gpu_models=models))
    for model in sorted(m for m in offered.get("mig", ()) if not allowed or m in allowed):
        fits = sorted((p.memory_mib, p.compute, p.name) for p in migcat.profiles_for(model).values()
                      if p.memory_mib >= memory_mib)
        if fits:
            shares.append(Share(mig_profile=fits[0][2], gpu_models=(model,)))
    if not shares:
        return {}
    first = shares[0]
    return {"gpu_fraction_milli": first.gpu_fraction_milli, "gpu_memory_mib": first.gpu_memory_mib,
            "mig_profile": first.mig_profile, "gpu_models": first.gpu_models,
            "alternatives": (*shares[1:], Share(gpu_models=models))}


def build_requests(rows: Iterable[Row], live: Mapping[str, set[int]],
                   offered: Mapping[str, set[str]] | None = None, dev_fraction_milli: int = 500,
                   dev_memory_mib: int = 16384) -> list[JobRequest]:
    """One request per schedulable unit: the whole job (single or gang), or each missing replica (the plain form of
    `RequestBuilder.build`, which remembers)."""
    out: list[JobRequest] = []
    for r in rows:
        units, held = _units(r, offered or {}, dev_fraction_milli, dev_memory_mib), live.get(r["job_id"])
        if not held:
            out += units
        elif is_replica_set(r) and not r["gang_nodes"]:
            out += [u for i, u in enumerate(units) if i not in held]
    return out


def node_selector(user: Mapping[str, str] | None, isolation: str | None) -> tuple[tuple[str, str], ...]:
    """The labels a wanted job's nodes must carry: those its submitter asked for (`node_selector`) and the one its
    work's isolation implies (which wins a clash: the work cannot run elsewhere)."""
    return tuple(sorted({**(user or {}), **dict(isolation_selector(isolation))}.items()))


def isolation_selector(isolation: str | None) -> tuple[tuple[str, str], ...]:
    """The node selector a wanted job's work implies (`isolation`: the work's driver, None without work). A job
    without work holds GPUs for a caller who launches what runs on them: any node will do, also one registered
    before agents reported their drivers (it has no labels). A job with work needs a node whose agent says it can
    run that driver — `process` too: an agent that does not run work (GPUPOOL_AGENT_RUN_WORK=false, or older than
    the executor) registers no isolation label, and would hold the GPUs without ever starting the command."""
    return () if not isolation else ((ISOLATION_LABEL_PREFIX + isolation, "true"),)


def pending_reasons(pending: Iterable[PendingReason], requests: Iterable[JobRequest],
                    nodes: Iterable[Node] | None = None) -> dict[str, tuple[str, str]]:
    """Each wanted job's (reason, message) as `explain` shows it: the core's, one per job (its units share it),
    except that a unit no node matches because of its work's isolation says which driver no schedulable node
    offers (`NoNodeOffersIsolation`) instead of the core's generic `NoNodeMatchesSelector`. With `nodes` (the
    snapshot's), a unit whose driver some schedulable node offers keeps the core's reason: the labels its
    submitter asked for are what no node has."""
    pending = list(pending)
    shown = ShownReason(pending, requests, nodes)
    return {split_unit(r.job_id)[0]: shown(r) for r in pending}


class ShownReason:
    """`pending_reasons` for one unit at a time: what `explain` shows for a unit's core reason, given the cycle's
    requests and nodes (read only when some unit's reason is `NoNodeMatchesSelector`)."""

    def __init__(self, pending: Iterable[PendingReason], requests: Iterable[JobRequest],
                 nodes: Iterable[Node] | None = None) -> None:
        self.selectors: dict[str, tuple[tuple[str, str], ...]] = {}
        self.offered: set[tuple[str, str]] | None = None
        self.selecting = any(r.reason == NO_NODE_MATCHES_SELECTOR for r in pending)  # some unit's reason is that
        if self.selecting:
            self.selectors = {q.job_id: q.node_selector for q in requests if q.node_selector}
            if nodes is not None:
                self.offered = {kv for n in nodes if n.schedulable for kv in n.labels
                                if kv[0].startswith(ISOLATION_LABEL_PREFIX)}

    def __call__(self, r: PendingReason) -> tuple[str, str]:
        reason, message = r.reason, r.message
        if reason != NO_NODE_MATCHES_SELECTOR:  # the common case, and the only one a driver could change
            return reason, message
        driver = next((k.removeprefix(ISOLATION_LABEL_PREFIX) for k, _ in self.selectors.get(r.job_id, ())
                       if k.startswith(ISOLATION_LABEL_PREFIX)), None)
        if self.offered is not None and (ISOLATION_LABEL_PREFIX + str(driver), "true") in self.offered:
            driver = None
        if driver is not None:
            reason = NO_NODE_OFFERS_ISOLATION
            message = (f"its work runs with isolation {driver!r}, and no schedulable node offers it: none has the "
                       f"label {ISOLATION_LABEL_PREFIX}{driver}=true, which a node's agent registers for each driver "
                       f"it can run")
        return reason, message


def pending_facts(pending: Iterable[PendingReason]) -> dict[str, str]:
    """Each wanted job's reason facts as `explain` returns them (`PendingFacts` JSON), one per job like its reason."""
    texts: dict[int, tuple[ReasonFacts, str]] = {}  # by the very object: jobs answered alike share their facts
    out: dict[str, str] = {}
    for r in pending:
        hit = texts.get(id(r.facts))
        if hit is None:
            hit = texts[id(r.facts)] = (r.facts, facts_json(r.facts))
        out[split_unit(r.job_id)[0]] = hit[1]
    return out


_FACTS_JSON: dict[ReasonFacts, str] = {}


def facts_json(f: ReasonFacts) -> str:
    """`reason_facts_json(f)`, remembered: a backlog's jobs keep the same facts cycle after cycle (and jobs alike
    share them), and validating and encoding each of thousands again was a large part of a cycle."""
    text = _FACTS_JSON.get(f)
    if text is None:
        if len(_FACTS_JSON) > 50_000:
            _FACTS_JSON.clear()
        text = _FACTS_JSON[f] = reason_facts_json(f)
    return text


def reason_facts_json(f: ReasonFacts) -> str:
    """The core's facts as the contract says them (validated; lists cut at MAX_LISTED, their counts beside them;
    milli-GPUs as GPUs; the reservation's start as a UTC time)."""
    q, w = f.quota, f.wait
    start = f.reservation_start
    doc = PendingFacts(
        cause=f.cause, ask=f.ask[:500], cpu_milli=f.cpu_milli, memory_mib=f.memory_mib,
        nodes_evaluated=f.nodes_evaluated, filtered=dict(f.filtered), short=dict(f.short), exhausted=f.exhausted,
        nodes_able=f.nodes_able, nodes_needed=f.nodes_needed, gpus_able=f.gpus_able, domain_kind=f.domain_kind,
        domain=f.domain, domain_nodes=f.domain_nodes, labels=dict(f.labels[:64]),
        holders=list(f.holders[:MAX_LISTED]), blocked_by=split_unit(f.blocked_by)[0] if f.blocked_by else "",
        quota=QuotaRefusal(path=q.path, gpu_model=q.gpu_model, rule=q.rule, used_gpus=max(q.used_milli, 0) / 1000,
                           asked_gpus=q.asked_milli / 1000, limit_gpus=max(q.limit_milli, 0) / 1000,
                           guaranteed_gpus=q.guaranteed_milli / 1000) if q is not None else None,
        victims_considered=f.victims_considered,
        victims=[Victim(job_id=split_unit(v)[0], reason=why) for v, why in f.victims[:MAX_LISTED]],
        victim_count=len(f.victims), victim_nodes=list(f.victim_nodes[:MAX_LISTED]), within_quota=f.within_quota,
        wait=PreemptionWait(would_preempt=[split_unit(v)[0] for v in w.would_preempt[:MAX_LISTED]],
                            lost_gpu_hours=w.lost_gpu_s / 3600, waited_gpu_hours=w.waited_gpu_s / 3600,
                            max_wait_s=w.max_wait_s) if w is not None else None,
        reservation_nodes=list(f.reservation_nodes[:MAX_LISTED]), reservation_node_count=len(f.reservation_nodes),
        reservation_start=datetime.fromtimestamp(start, UTC) if start is not None and start != float("inf")
        else None,
        reservation_in_s=f.reservation_in_s, soft_hold=start == float("inf"), detail=f.detail[:2000])
    return doc.model_dump_json(exclude_defaults=True)


def _units(r: Row, offered: Mapping[str, set[str]], dev_fraction_milli: int, dev_memory_mib: int) -> list[JobRequest]:
    """Every schedulable unit of a wanted job, as if it held nothing yet."""
    common: dict[str, Any] = dict(
        team=r["team"], project=r["project"], gpus=r["gpus"], gpu_models=tuple(r["gpu_models"]),
        priority=r["priority"], priority_class=r["priority_class"] or "", kind=r["kind"] or "batch",
        submitted_at=r["submitted_at"].timestamp(), max_runtime_s=r["max_runtime_s"],
        gpu_fraction_milli=r["gpu_fraction_milli"], gpu_memory_mib=r["gpu_memory_mib"],
        mig_profile=r["mig_profile"], node_selector=node_selector(r.get("node_selector"), r.get("isolation")),
        cpu_milli=r.get("cpu_milli") or 0, memory_mib=r.get("memory_mib") or 0, preemptible=r.get("preemptible"))
    common.update(dev_share(r, offered, dev_fraction_milli, dev_memory_mib))
    if r["gang_nodes"]:
        return [JobRequest(job_id=r["job_id"], gang_nodes=r["gang_nodes"], gpus_per_node=r["gpus_per_node"],
                           **common)]
    if is_replica_set(r):
        return [JobRequest(job_id=unit_id(r["job_id"], i, True), replica_group=r["job_id"], **common)
                for i in range(r["replicas"])]
    return [JobRequest(job_id=r["job_id"], **common)]


class RequestBuilder:
    """`build_requests` that remembers: a wanted job whose row is the same object as last cycle's (WantedJobs keeps
    unchanged rows) gets the same JobRequest objects back. Building them was a large part of a cycle with a deep
    backlog, and the core's per-request cache (keyed by the request object) now hits instead of normalizing every
    request again. Forgets everything when what the pool offers to dev jobs changes (their share depends on it)."""

    def __init__(self) -> None:
        self._units = ByObject()
        self._key: tuple | None = None

    def build(self, rows: Iterable[Row], live: Mapping[str, Collection[int]], offered: Mapping[str, set[str]],
              dev_fraction_milli: int, dev_memory_mib: int) -> list[JobRequest]:
        """`live`: job -> the replicas it holds (only replicas it does not hold are asked for again)."""
        key = (sorted((k, sorted(v)) for k, v in offered.items()), dev_fraction_milli, dev_memory_mib)
        if key != self._key:
            self._key, self._units = key, ByObject()
        rows = rows if isinstance(rows, list) else list(rows)
        units = self._units.of(rows, lambda r: _units(r, offered, dev_fraction_milli, dev_memory_mib))
        if live:
            ids = list(map(itemgetter("job_id"), rows))
            holding = live.keys() & set(ids)
            for i in [i for i, job_id in enumerate(ids) if job_id in holding] if holding else ():
                r, held = rows[i], live[ids[i]]
                units[i] = ([u for k, u in enumerate(units[i]) if k not in held]
                            if is_replica_set(r) and not r["gang_nodes"] else [])
        return list(chain.from_iterable(units))


def build_policy(name: str, classes: Iterable[Row], quotas: Iterable[Row], teams: Iterable[Row],
                 min_runtime_s: float, fair_share_half_life_s: float) -> Policy:
    """The quota service's classes and quota tree (core defaults until it has told us anything)."""
    priority_classes = tuple(
        PriorityClass(c["name"], c["value"], preemptible=c["preemptible"], min_runtime_s=c["min_runtime_s"])
        for c in sorted(classes, key=lambda c: (-c["value"], c["name"]))
    ) or DEFAULT_PRIORITY_CLASSES
    entries = tuple(
        QuotaEntry(path=q["path"], guaranteed=q["guaranteed"], gpu_model=q["gpu_model"],
                   borrowing_limit=q["borrowing_limit"], lending_limit=q["lending_limit"], weight=q["weight"])
        for q in sorted(quotas, key=lambda q: (q["path"], q["gpu_model"]))
    )
    team_org = tuple(sorted((t["team"], t["org"]) for t in teams))
    return Policy(name=name, priority_classes=priority_classes, quotas=QuotaTree(entries=entries, team_org=team_org),
                  min_runtime_s=min_runtime_s, fair_share_half_life_s=fair_share_half_life_s)


def allocated_gpus(p: Placement, models: Mapping[str, str]) -> tuple[list[AllocatedGpu], dict[str, int]]:
    """What one placement holds of each GPU, and the memory slots each MIG instance occupies (for the store's
    overlap check)."""
    out: list[AllocatedGpu] = []
    slots: dict[str, int] = {}
    for uuid, index in zip(p.gpu_uuids, p.gpu_indices, strict=True):
        model = models[uuid]
        if p.mig is not None:
            prof = migcat.profile(model, p.mig.profile)
            assert prof is not None, f"{p.mig.profile} is not a MIG profile of {model}"
            out.append(AllocatedGpu(uuid=uuid, index=index, model=model, share_milli=prof.milli,
                                    mig_profile=prof.name, mig_start=p.mig.start))
            slots[uuid] = prof.slots
        elif p.gpu_fraction_milli:
            out.append(AllocatedGpu(uuid=uuid, index=index, model=model, share_milli=p.gpu_fraction_milli,
                                    memory_mib=p.gpu_memory_mib or None))
        else:
            out.append(AllocatedGpu(uuid=uuid, index=index, model=model))
    return out, slots


def decided_placements(plan: Plan, applied: set[str]) -> list[DecidedPlacement]:
    out = []
    for p in plan.placements:
        share = p.gpu_fraction_milli or 1000
        if p.mig is not None:
            prof = migcat.profile(p.gpu_model, p.mig.profile)
            share = prof.milli if prof else share
        out.append(DecidedPlacement(unit=p.job_id, node=p.node, gpus=list(p.gpu_uuids), share_milli=share,
                                    mig_profile=p.mig.profile if p.mig else None, applied=p.job_id in applied))
    return out


def decided_cycle(cycle_id: str, decided_at: datetime, policy: str, snapshot: Snapshot, units: int, plan: Plan,
                  applied: set[str], policy_revision: int | None, digests: tuple[str, str]) -> SchedulingCycleDecided:
    """What a recorded cycle decided, with the versions it read (`units` pending) and its (input, plan) digests."""
    return SchedulingCycleDecided(
        cycle_id=cycle_id, decided_at=decided_at, policy=policy, input_digest=digests[0], plan_digest=digests[1],
        versions={"policy_revision": policy_revision or 0, "nodes": len(snapshot.nodes),
                  "gpus": sum(len(n.gpus) for n in snapshot.nodes), "running": len(snapshot.running),
                  "pending_units": units},
        placements=decided_placements(plan, applied),
        preemptions=[DecidedPreemption(victim=v.job_id, preemptor=v.preemptor, reason=v.reason)
                     for v in plan.preemptions],
        pending_by_reason=dict(Counter(r.reason for r in plan.pending)))


def workload_environment(gpus: list[AllocatedGpu], allocation_id: str | None = None) -> dict[str, str]:
    """The environment that keeps a workload inside what it was granted. Whole GPUs: only those are visible. A
    fraction: CUDA MPS caps its share of the SMs (active thread percentage, rounded up) and the device memory it may
    pin (`<device>=<MiB>M`, device 0 of the ones it sees). A MIG slice: the agent creates the instance and reports
    its own UUID, which is what the workload must see; the GPU's is given here as the parent. GPUPOOL_ALLOCATION_ID
    lets the node agent tell which allocation a GPU process belongs to (it reads the process's environment)."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus)}
    if allocation_id:
        env["GPUPOOL_ALLOCATION_ID"] = allocation_id
    fractions = [g for g in gpus if g.share_milli < 1000 and g.mig_profile is None]
    if fractions:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, -(-fractions[0].share_milli // 10)))
        if fractions[0].memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={fractions[0].memory_mib}M"
    return env


# --- allocations that run work: released by the end of the work, not by a decision --------------------------------
# Releases that cannot wait for the agent: the node is gone, so nothing will ever report its work's end.
RELEASE_AT_ONCE = frozenset({"NodeLost"})


BACKOFF_FIRST_S = 1.0  # a replicated job's first failed replica waits this long to be placed again ...
BACKOFF_MAX_S = 300.0  # ... doubling with each failure in a row, up to this
HEALTHY_RUN_S = 60.0  # a replica that ran this long before failing starts the count again


def replica_back_off(failures_before: int, ran_s: float) -> tuple[int, float]:
    """Pure rule: a replica of a replicated job failed after running `ran_s` (0 for a launch failure). Returns the
    failures in a row now and how long the job's next placement waits (Kubernetes' crash-loop back-off)."""
    failures = 1 if ran_s >= HEALTHY_RUN_S else failures_before + 1
    return failures, min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** min(failures - 1, 30))


def backoff_reasons(backing_off: Mapping[str, Row]) -> dict[str, tuple[str, str]]:
    """The pending reason of each replicated job waiting out its back-off (what `explain` shows)."""
    return {job_id: ("CrashLoopBackOff", f"{row['replica_failures']} replica failure(s) in a row; placed again "
                                         f"after {row['not_before'].isoformat()}")
            for job_id, row in backing_off.items()}


@dataclasses.dataclass(frozen=True)
class WorkEnd:
    """What placement does when the agent reports an allocation's work ended (its cgroup empty): release it with
    `reason`, and with `stop_others` ask the job's other live members to stop (reason GangMemberFailed)."""

    reason: str
    stop_others: bool = False


def on_work_end(*, stop_reason: str | None, exit_reason: str, gang_nodes: int) -> WorkEnd:
    """Pure rule. A stop placement asked for (preemption, cancel, completion, reclaim, scale-down, a failed gang
    member) keeps its reason, whatever the exit code: a preempted job is requeued even if it exited non-zero
    inside its grace (Slurm's GraceTime rule). Otherwise: exit 0 → `WorkCompleted`; over its max runtime →
    `MaxRuntimeExceeded`; any other end → `WorkFailed`, and a gang's other members are stopped (a gang runs and
    fails as one)."""
    if stop_reason:
        return WorkEnd(stop_reason)
    if exit_reason == "Completed":
        return WorkEnd("WorkCompleted")
    reason = "MaxRuntimeExceeded" if exit_reason == "MaxRuntimeExceeded" else "WorkFailed"
    return WorkEnd(reason, stop_others=gang_nodes > 0)


def gang_ready(members: Iterable[Row], gang_nodes: int) -> bool:
    """Pure rule: a gang starts once it has all its members live, each still waiting and reported ready (its
    grant applied on its node), none of them being stopped."""
    members = list(members)
    return (gang_nodes > 1 and len(members) == gang_nodes
            and all(m["gang_wait"] and m["ready_at"] is not None and m["preempt_deadline"] is None
                    for m in members))


def gang_start_due(running: Iterable[Row], timeout_s: float) -> datetime | None:
    """When the earliest gang still waiting for its members runs out of time (None: none is waiting)."""
    waiting = [r["granted_at"] for r in running if r.get("gang_wait") and r["preempt_deadline"] is None]
    return min(waiting) + timedelta(seconds=timeout_s) if waiting else None


# --- a job's rendezvous: what torchrun (and DeepSpeed, Accelerate) read to find the job's other members ----------
@dataclasses.dataclass(frozen=True)
class Member:
    """One allocation of a job that runs as one (a single job, or a gang member): its rank and where it runs."""

    rank: int
    cluster: str
    node: str
    address: str  # where the node's peers reach it ('' if its agent did not say: the node's name stands in)
    gpus: int


def port_host(address: str, cluster: str, node: str) -> str:
    """The machine a rendezvous port is taken on. Every loopback address is this one machine (a simulated fleet's
    nodes are 127.0.0.x on one host, and a rendezvous store binds all of its interfaces), so their ports must
    differ; any other address is its own host; a node without an address, its name."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return "loopback"
    except ValueError:
        pass
    return address or f"{cluster}/{node}"


def choose_port(held: set[int], first: int, last: int) -> int | None:
    """The lowest port of [first, last] no live job holds on that host (None: all of them are held)."""
    return next((p for p in range(first, last + 1) if p not in held), None)


def rendezvous_environment(job_id: str, members: list[Member], port: int) -> dict[int, dict[str, str]]:
    """Each member's environment (by rank): torchrun's `PET_*` (so `torchrun` with no arguments but the script
    joins the job), the env:// names (`MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` = members, `NODE_RANK`, `RANK` =
    the member's rank, as Kubeflow's PyTorchJob sets them; torchrun gives its own workers theirs), and
    `GPUPOOL_NODE_IPS`: every member's address in rank order."""
    ordered = sorted(members, key=lambda m: m.rank)
    addresses = [m.address or m.node for m in ordered]
    master = addresses[0]
    common = {"PET_NNODES": str(len(ordered)), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port),
              "PET_RDZV_ID": job_id, "PET_RDZV_ENDPOINT": f"{master}:{port}", "MASTER_ADDR": master,
              "MASTER_PORT": str(port), "WORLD_SIZE": str(len(ordered)), "GPUPOOL_NODE_IPS": ",".join(addresses),
              "GPUPOOL_RENDEZVOUS_PORT": str(port)}
    return {m.rank: {**common, "PET_NPROC_PER_NODE": str(max(1, m.gpus)), "PET_NODE_RANK": str(m.rank),
                     "NODE_RANK": str(m.rank), "RANK": str(m.rank)} for m in ordered}


@dataclasses.dataclass
class RendezvousPorts:
    """The cycle's view of rendezvous ports: who is where (node addresses) and which ports live jobs hold on each
    host. `take` reserves one for a job on its rank-0 member's host (also against the jobs placed before it in the
    same cycle)."""
    addresses: dict[tuple[str, str], str]
    held: dict[str, set[int]]
    ports: tuple[int, int]

    @classmethod
    def of(cls, nodes: Iterable[Any], running: Iterable[Any], ports: tuple[int, int]) -> RendezvousPorts:
        held: dict[str, set[int]] = defaultdict(set)
        for r in running:
            if r.get("rendezvous_port") is not None:
                held[r["rendezvous_host"]].add(r["rendezvous_port"])
        return cls({(n["cluster"], n["node"]): n.get("address") or "" for n in nodes}, held, ports)

    def take(self, job_id: str, placements: list[Placement]) -> tuple[str, int, dict[int, dict[str, str]]] | None:
        """(host, port, each member's environment by rank), or None when every port of the range is held there."""
        members = [Member(rank=p.replica, cluster=p.cluster, node=p.node,
                          address=self.addresses.get((p.cluster, p.node), ""), gpus=len(p.gpu_uuids))
                   for p in placements]
        first = min(members, key=lambda m: m.rank)
        host = port_host(first.address, first.cluster, first.node)
        held = self.held.setdefault(host, set())
        port = choose_port(held, *self.ports)
        if port is None:
            return None
        held.add(port)
        return host, port, rendezvous_environment(job_id, members, port)


# --- a rolling update of a service's work -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RolloutStep:
    """`stop` one replica (its allocation) that runs older work, `finish` (every replica runs the new work and the
    target is ready: the surge replica goes), or `wait`."""

    action: str
    allocation_id: str | None = None
    replica: int | None = None


def rollout_step(members: Iterable[Row], work: str, target: int) -> RolloutStep:
    """Pure rule (maxSurge 1, maxUnavailable 0): an outdated replica that is not ready is stopped at once (it
    serves nothing); a ready one only when target + 1 replicas are ready and no other stop is under way, so the
    ready count never falls below the target. Done when nothing outdated is left and every replica that stays
    (those numbered below the target) is live and ready: only then does the surge replica go."""
    members = list(members)
    live = [m for m in members if m["preempt_deadline"] is None]
    outdated = [m for m in live if m["work"] != work]
    stopping = any(m["preempt_deadline"] is not None for m in members)
    if not outdated:
        staying = {m["replica"] for m in live if m["replica"] < target and m["ready"]}
        done = not any(m["work"] != work for m in members) and len(staying) == target
        return RolloutStep("finish") if done else RolloutStep("wait")
    idle = [m for m in outdated if not m["ready"]]
    pick = idle[0] if idle else outdated[0]
    if idle or (not stopping and sum(m["ready"] for m in live) >= target + 1):
        return RolloutStep("stop", pick["allocation_id"], pick["replica"])
    return RolloutStep("wait")
