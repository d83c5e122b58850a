"""Filter -> score -> select: where one job's parts fit on the cluster state, best first (`PlacementSearch`, the
scheduler's base). Pure: no I/O; every answer is a function of the state, the policy and the request.

Nodes with equal free-GPU layouts are grouped (`ClusterState.groups`) and each group is scored once through a
representative node; `choose` gives a group's candidate GPU sets, `fragmentation` the FGD fragmentation measure
against the workload's shapes. `_place` takes a job all or nothing (gangs member by member, NVLink/rack-local when
the shape prefers it) on the state's journal, so a caller can roll it back; `_why` says why nothing fits.
"""

from __future__ import annotations

import math

from libs.core import mig as migcat
from libs.core.explain import DIMENSIONS
from libs.core.fit import (
    CPU_KIND,
    FRAC_KIND,
    FRACTIONAL,
    MIG,
    MIG_KIND,
    WHOLE_KIND,
    Choice,
    GpuShape,
    Shape,
    apply_choice,
    choose,
    fragmentation,
    gpu_eligible,
    used_share,
)
from libs.core.model import EXCLUSIVE, WHOLE, JobRequest
from libs.core.plan import ReasonFacts
from libs.core.policy import KindPolicy, Policy
from libs.core.reasons import NO_FEASIBLE_NODE, NO_NODE_MATCHES_SELECTOR, RESERVED_FOR_GANG, WAITING_FOR_GANG
from libs.core.state import ClusterState, Take


class PlacementSearch:
    """The search over a cluster state, with the memos that make it fast across jobs and cycles."""

    def __init__(self, state: ClusterState, policy: Policy, gpu_shapes: tuple[GpuShape, ...],
                 gpuless_share: float = 0.0) -> None:
        self.state = state
        self.policy = policy
        self.gpu_shapes = gpu_shapes  # the workload FGD's fragmentation is measured against
        self.gpuless_share = gpuless_share  # its GPU-less part: every free GPU is lost to it
        self._frag_memo: dict = {}
        self._choose_memo: dict = {}
        self._class_memo: dict = {}
        self.elig_memo: dict = {}  # (node class, shape, models) -> positions of GPUs that could serve it
        self.n_scored = 0  # node groups scored (the cycle resets it: a statistic of its plan)
        self._shape_ids: dict = {}
        self._allowed_memo: dict = {}  # (shape id, models) -> (what it takes of each, the most of them)
        self._models_memo: dict = {}  # shape -> the models that could serve it
        self._kinds: dict[str, KindPolicy] = {k.kind: k for k in policy.kinds}
        self._models = sorted(state.capacity)
        self._model_mem: dict[str, int] = {}
        for ns in state.nodes:
            for g in ns.gpus:
                self._model_mem[g.model] = max(self._model_mem.get(g.model, 0), g.memory_mib)
        self._empty: dict[int, tuple] = {}  # node class -> its free state when nothing runs there
        self._class_nodes: dict[int, list[int]] | None = None  # node class -> [schedulable nodes, others]
        self._scarce: dict[int, tuple[tuple, ...]] = {}  # node class -> scarce shapes it could run (`scarce_hosts`)
        self._cache_settings()

    # ---- scarce hosts ---------------------------------------------------------------------------------------

    def protect_scarce(self, workload) -> None:
        """Remember, per node class, the workload's whole-GPU shapes (however rare: the typical mix carries its
        rare tail at weight 0) that an empty node of the class could run (`Policy.scarce_hosts`)."""
        self._scarce = {}
        if not self.policy.setting("scarce_hosts"):
            return
        shapes = []
        for w in workload:
            if w.gpus > 0 and not w.mig_profile and w.gpu_milli >= WHOLE:
                s = (w.gpus, frozenset(w.gpu_models) or None, w.cpu_milli, w.memory_mib)
                if s not in shapes:
                    shapes.append(s)
        shapes.sort(key=lambda s: -s[0])  # the biggest first: a search stops at shapes no bigger than its job
        for c in self.state.classes:
            mine = tuple(s for s in shapes if _could_run(c, s))
            if mine:
                self._scarce[c.id] = mine

    def _hosts_now(self, s: tuple, limit: int) -> int:
        """How many nodes could run scarce shape `s` now, counted up to `limit` + 1."""
        n = 0
        gpus = s[0]
        for cid, by_free in self.state.by_free.items():
            if s not in self._scarce.get(cid, ()):
                continue
            cls = self.state.classes[cid]
            groups = self.state.groups[cid]
            for count, keys in by_free.items():
                if count < gpus:
                    continue
                for key in keys:
                    for idx in groups[key]:
                        if _can_run_now(cls, key[0], self.state.nodes[idx], 0, 0, s):
                            n += 1
                            if n > limit:
                                return n
        return n

    def _breaks_scarce(self, cid: int, dyn: tuple, rep, choice: Choice, shape: Shape, hosts: dict) -> bool:
        """Taking `choice` on `rep` leaves it unable to run a shape of the workload that it can run now and that at
        most `scarce_hosts` nodes can run now (`hosts`: this search's counts so far). Work at least as big as the
        shape (more GPUs on the node, or as many with as much CPU and memory) is not held back by it."""
        cls = self.state.classes[cid]
        limit = self._scarce_limit
        after = None
        for s in self._scarce[cid]:
            if shape.per_node >= s[0]:
                if shape.per_node > s[0]:
                    break
                if shape.cpu >= s[2] and shape.mem >= s[3]:
                    continue  # the job is itself at least this shape
            if not _can_run_now(cls, dyn, rep, 0, 0, s):
                continue
            if after is None:
                after = apply_choice(cls, dyn, choice, shape)
            if _can_run_now(cls, after, rep, shape.cpu, shape.mem, s):
                continue
            n = hosts.get(s)
            if n is None:
                n = hosts[s] = self._hosts_now(s, limit)
            if n <= limit:
                return True
        return False

    def _empty_dyn(self, cid: int) -> tuple:
        got = self._empty.get(cid)
        if got is None:
            got = self._empty[cid] = tuple(
                None if not st[5] else (0, ()) if st[2] == MIG else (WHOLE, st[1]) if st[2] == FRACTIONAL else WHOLE
                for st in self.state.classes[cid].gpus)
        return got

    def _why_never(self, shape: Shape, sid: int, allowed: frozenset,
                   nodes_by_class: dict[int, int]) -> dict | None:
        """Why the shape could not fit this pool even with every schedulable node empty (`nodes_by_class`: how
        many schedulable nodes each node class has), as the facts of an `Unschedulable` reason; None when it
        could."""
        classes = [cid for cid in self._classes_for(shape, allowed) if nodes_by_class.get(cid)]
        if shape.kind == CPU_KIND:
            return None if classes else {"cause": "never_host"}
        if shape.members >= 1:
            able = sum(nodes_by_class[cid] for cid in classes
                       if self._choices(cid, self._empty_dyn(cid), shape, sid, shape.per_node, allowed, "first"))
            if able >= shape.members:
                return None
            if shape.members == 1:
                return {"cause": "never_node"}
            return {"cause": "never_members", "nodes_able": able, "nodes_needed": shape.members}
        whole = sum(nodes_by_class[cid] * sum(1 for st in self.state.classes[cid].gpus
                                              if st[5] and st[2] != MIG and gpu_eligible(st, shape, allowed))
                    for cid in classes)
        if whole >= shape.total:
            return None
        return {"cause": "never_gpus", "gpus_able": whole}

    def _census(self, shape: Shape, sid: int, allowed: frozenset) -> dict:
        """Every node, and why it does not take the shape now: filtered out (could never serve it) or short of a
        resource (see `plan.ReasonFacts`). Per node class, then per free state (a group) once; only the nodes of a
        group whose GPUs would serve it are looked at one by one (their CPU and memory)."""
        st = self.state
        if self._class_nodes is None:  # node class -> [schedulable nodes, others]: fixed for the state's life
            self._class_nodes = {}
            for ns in st.nodes:
                self._class_nodes.setdefault(ns.cls, [0, 0])[0 if ns.schedulable else 1] += 1
        filtered: dict[str, int] = {}
        short: dict[str, int] = {}
        per = shape.per_node if shape.members else 1
        dim = "gpu_share" if shape.kind == FRAC_KIND else "mig_slice" if shape.kind == MIG_KIND else "gpus"
        for cid, (n_sched, n_other) in self._class_nodes.items():
            if n_other:
                filtered["cordoned"] = filtered.get("cordoned", 0) + n_other
            why = self._filtered_by(cid, shape, allowed) if n_sched else ""
            if why:
                filtered[why] = filtered.get(why, 0) + n_sched
                continue
            seen = 0
            for key, bucket in st.groups.get(cid, {}).items():
                seen += len(bucket)
                if shape.kind != CPU_KIND and not self._choices(cid, key[0], shape, sid, per, allowed, "first"):
                    short[dim] = short.get(dim, 0) + len(bucket)
                    continue
                for idx in bucket:
                    ns = st.nodes[idx]
                    lack = "cpu" if ns.cpu_cap and ns.cpu_free < shape.cpu else \
                        "memory" if ns.mem_cap and ns.mem_free < shape.mem else "able"
                    short[lack] = short.get(lack, 0) + 1
            if n_sched > seen:  # the rest are hidden: held for another job
                short["reserved"] = short.get("reserved", 0) + n_sched - seen
        exhausted = max((d for d in DIMENSIONS if short.get(d)), key=lambda d: short[d], default="")
        return {"nodes_evaluated": len(st.nodes), "filtered": tuple(sorted(filtered.items())),
                "short": tuple(sorted(short.items())), "exhausted": exhausted}

    def _filtered_by(self, cid: int, shape: Shape, allowed: frozenset) -> str:
        """Why no node of class `cid` could ever serve the shape ("" when one could)."""
        c = self.state.classes[cid]
        if not shape.selector <= c.labels:
            return "node_selector"
        if shape.kind != CPU_KIND and not any(gpu_eligible(g, shape, allowed) for g in c.gpus):
            models = [g for g in c.gpus if g[0] in allowed and g[1] >= shape.min_mem]
            if not models:
                return "gpu_model"
            healthy = [g for g in models if g[5]]
            return "sharing" if healthy else "health"
        if (c.cpu_cap and c.cpu_cap < shape.cpu) or (c.mem_cap and c.mem_cap < shape.mem):
            return "host_size"
        return ""

    def _kind(self, name: str) -> KindPolicy:
        k = self._kinds.get(name)
        if k is None:
            k = self._kinds[name] = self.policy.kind(name)
        return k


    def _sid(self, shape: Shape) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self._shape_ids)
        return sid

    def _classes_for(self, shape: Shape, allowed: frozenset) -> list[int]:
        key = (shape, allowed)
        out = self._class_memo.get(key)
        if out is None:  # classes with a GPU that could ever serve the shape (model, memory, sharing mode)
            out = [
                c.id
                for c in self.state.classes
                if shape.selector <= c.labels
                and (shape.kind == CPU_KIND or any(gpu_eligible(st, shape, allowed) for st in c.gpus))
                and (not c.cpu_cap or c.cpu_cap >= shape.cpu) and (not c.mem_cap or c.mem_cap >= shape.mem)
            ]
            self._class_memo[key] = out
        return out

    def _choices(self, cid: int, dyn: tuple, shape: Shape, sid: int, per_node: int, allowed: frozenset,
                 mode: str, kid: int | None = None) -> tuple:
        key = (kid, sid, per_node, allowed, mode) if kid is not None else (cid, dyn, sid, per_node, allowed, mode)
        out = self._choose_memo.get(key)
        if out is None:
            if len(self._choose_memo) > 400_000:
                self._choose_memo.clear()
            out = choose(self.state.classes[cid], dyn, shape, per_node, allowed, mode)
            self._choose_memo[key] = out
        return out

    def _frag(self, cid: int, dyn: tuple, mask: int) -> float:
        key = (cid, dyn, mask)
        v = self._frag_memo.get(key)
        if v is None:
            if len(self._frag_memo) > 400_000:
                self._frag_memo.clear()
            v = fragmentation(self.state.classes[cid], dyn, mask, self.gpu_shapes, self.gpuless_share)
            self._frag_memo[key] = v
        return v

    def _cache_settings(self) -> None:
        p = self.policy
        self._w_frag = p.setting("w_frag")
        self._w_binpack = p.setting("w_binpack")
        self._w_spread = p.setting("w_spread")
        self._w_topology = p.setting("w_topology")
        self._max_candidates = p.max_candidates
        self._frag_index = p.setting("frag_ties") in ("index", "busy")
        self._frag_busy = p.setting("frag_ties") == "busy" and self._w_frag > 0
        self._scarce_limit = p.setting("scarce_hosts")
        self._mode_v = self._mode()

    def _mode(self) -> str:
        p = self.policy
        if p.setting("fit") == "first":
            return "first"
        if p.setting("w_frag") > 0:
            return "frag"
        return "loose" if p.setting("w_spread") > p.setting("w_binpack") else "tight"

    def _rep(self, bucket: dict, shape: Shape, exclude: set, domain: str | None, lowest: bool):
        nodes = self.state.nodes
        host = bool(shape.cpu or shape.mem)
        best = None
        scanned = 0
        for idx in bucket:
            ns = nodes[idx]
            if idx in exclude or (host and not ns.host_fits(shape.cpu, shape.mem)):
                continue
            if lowest:
                if best is None or idx < best.idx:
                    best = ns
                continue
            if domain is None or ns.topology == domain:
                return ns
            if best is None:
                best = ns
            scanned += 1
            if scanned > 64:
                break
        return best

    def _score(self, cid: int, dyn: tuple, mask: int, rep, choice: Choice, shape: Shape,
               domain: str | None, pack: float) -> tuple[float, float]:
        """(score, tie): `tie` orders choices of equal score before the lowest node index does — under
        `frag_ties="busy"` a request without GPUs prefers the node whose GPUs are the most in use; else 0."""
        cls = self.state.classes[cid]
        after = apply_choice(cls, dyn, choice, shape)
        tie = used_share(cls, dyn) if self._frag_busy and shape.kind == CPU_KIND else 0.0
        s = 0.0
        w_frag = self._w_frag
        if w_frag:
            if shape.kind == MIG_KIND:
                s += w_frag * choice.mig_score
            elif self.gpu_shapes:
                mask_after = self.state.host_mask(rep, shape.cpu, shape.mem)
                d = self._frag(cid, after, mask_after) - self._frag(cid, dyn, mask)
                if self._frag_index:  # FGD's whole-number score of the fall in fragmentation (in GPUs)
                    s += w_frag * int(100.0 / (1.0 + math.exp(min(50.0, d / WHOLE))))
                else:
                    s -= w_frag * d / WHOLE
        wb, ws = self._w_binpack + pack, self._w_spread
        if shape.prefer_shared and choice.positions:
            statics = cls.gpus
            s += sum(statics[p][2] != EXCLUSIVE for p in choice.positions) / len(choice.positions)
        if wb or ws:
            # packing measure: GPUs in use after the choice, averaged with CPU in use where the node tracks CPU,
            # so that ties go to the node whose spare capacity is smallest (big nodes stay free for big jobs)
            u = used_share(cls, after) if shape.kind != CPU_KIND else 0.0
            if rep.cpu_cap:
                cpu_u = 1.0 - (rep.cpu_free - shape.cpu) / rep.cpu_cap
                u = cpu_u if shape.kind == CPU_KIND else (u + cpu_u) / 2
            s += wb * u + ws * (1.0 - u)
        wt = self._w_topology
        if wt:
            s += wt * choice.topology
            if domain is not None:
                s += wt * _nearness(rep.topology, domain)
        return s, tie

    def _best(self, shape: Shape, sid: int, per_node: int, allowed: frozenset, exclude: set,
              domain: str | None, pack: float):
        """Filter -> score -> select: the best (node, choice) for one node's part of the request. At most
        `policy.max_candidates` feasible keys are scored (0: all), visited best first. `pack`: the job's kind's
        extra bin-packing weight."""
        mode = self._mode_v
        best = None
        best_key = None
        limit = self._max_candidates if mode != "first" else 0
        seen = 0
        kids = self.state.key_ids
        memo = self._choose_memo
        scarce = self._scarce
        hosts: dict = {}
        for cid in self._classes_for(shape, allowed):
            groups = self.state.groups.get(cid, {})
            if shape.kind == WHOLE_KIND:
                by_free = self.state.by_free.get(cid, {})
                counts = sorted((c for c in by_free if c >= per_node and by_free[c]), reverse=(mode == "loose"))
                keys = [k for c in counts for k in by_free[c]]
            else:
                keys = groups
            for key in keys:
                kid = kids[key]
                cands = memo.get((kid, sid, per_node, allowed, mode))
                if cands is None:
                    cands = self._choices(cid, key[0], shape, sid, per_node, allowed, mode, kid)
                if not cands:
                    continue
                bucket = groups[key]
                dyn, mask = key
                rep = self._rep(bucket, shape, exclude, domain, mode == "first" or self._frag_index)
                if rep is None:
                    continue
                if mode == "first":
                    k = (1, 0.0, 0.0, -rep.idx)
                    if best_key is None or k > best_key:
                        best_key, best = k, (rep.idx, cands[0])
                    continue
                self.n_scored += 1
                guard = cid in scarce
                for c in cands:
                    k = (0 if guard and self._breaks_scarce(cid, dyn, rep, c, shape, hosts) else 1,
                         *self._score(cid, dyn, mask, rep, c, shape, domain, pack), -rep.idx)
                    if best_key is None or k > best_key:
                        best_key, best = k, (rep.idx, c)
                seen += 1
                if limit and seen >= limit:
                    return best
        return best

    def _whole_count(self, cid: int, dyn: tuple, shape: Shape, allowed: frozenset) -> int:
        cls = self.state.classes[cid]
        counts: dict[str, int] = {}
        for st, d in zip(cls.gpus, dyn, strict=True):
            if gpu_eligible(st, shape, allowed):
                free = d if not isinstance(d, tuple) else d[0]
                if free == WHOLE:
                    counts[st[0]] = counts.get(st[0], 0) + 1
        return max(counts.values(), default=0)

    def _take(self, job: JobRequest, idx: int, choice: Choice, shape: Shape) -> Take:
        ns = self.state.nodes[idx]
        if shape.kind == WHOLE_KIND:
            gmem = ns.gpus[choice.positions[0]].memory_mib
            t = Take(job.job_id, idx, choice.positions, WHOLE, gmem, shape.cpu, shape.mem)
        elif shape.kind == FRAC_KIND:
            t = Take(job.job_id, idx, choice.positions, shape.milli, shape.gmem, shape.cpu, shape.mem)
        elif shape.kind == MIG_KIND:
            t = Take(job.job_id, idx, choice.positions, 0, 0, shape.cpu, shape.mem, mig=choice.mig)
        else:
            t = Take(job.job_id, idx, (), 0, 0, shape.cpu, shape.mem)
        self.state.take(t)
        return t

    def _place(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
               avoid: set[int] | None = None) -> list[Take] | None:
        """All-or-nothing placement of every part of the job, never on the nodes in `avoid`; None (and nothing
        changed) when it does not fit."""
        st = self.state
        mark = st.mark()
        takes: list[Take] = []
        used: set[int] = set(avoid) if avoid else set()
        domain = None
        if shape.members >= 1:
            if shape.members > 1 and shape.prefer_topology and self.state.topologies:
                # a gang goes to one rack (block) that can hold every member now, when one can
                fits = self._gang_domain(shape, sid, allowed, used)
                if fits is not None:
                    inside = set(fits[1])
                    outside = {ns.idx for ns in st.nodes if ns.idx not in inside}
                    got = self._members(job, shape, sid, allowed, used | outside, fits[0])
                    if got is not None:
                        return got
            got = self._members(job, shape, sid, allowed, used, None)
            if got is None:
                st.rollback(mark)
            return got
        remaining = shape.total
        while remaining > 0:
            pick = None
            pick_key = None
            levels: list[tuple[int, int, tuple]] = []  # (free count, class, key), most free first
            for cid in self._classes_for(shape, allowed):
                for c, keys in st.by_free.get(cid, {}).items():
                    if c > 0:
                        levels.extend((c, cid, key) for key in keys)
            levels.sort(key=lambda x: -min(x[0], remaining))
            best_level = None
            for c, cid, key in levels:
                if best_level is not None and min(c, remaining) < best_level:
                    break
                n = min(self._whole_count(cid, key[0], shape, allowed), remaining)
                if n <= 0:
                    continue
                rep = self._rep(st.groups[cid][key], shape, used, domain, False)
                if rep is None:
                    continue
                k = (n, domain is not None and rep.topology == domain, -rep.idx)
                if pick_key is None or k > pick_key:
                    pick_key, pick = k, (rep.idx, n)
                    best_level = n
            if pick is None:
                st.rollback(mark)
                return None
            idx, n = pick
            ns = st.nodes[idx]
            dyn = tuple(g.dyn() for g in ns.gpus)
            choice = self._choices(ns.cls, dyn, shape, sid, n, allowed, "tight" if self._mode_v == "frag"
                                   else self._mode_v)
            if not choice:
                st.rollback(mark)
                return None
            takes.append(self._take(job, idx, choice[0], shape))
            used.add(idx)
            remaining -= n
            if shape.prefer_topology and domain is None:
                domain = ns.topology
        return takes

    def _members(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset, used: set[int],
                 domain: str | None) -> list[Take] | None:
        """Each of the job's `shape.members` parts on its own node outside `used` (rolled back, None, when one does
        not fit); a gang's later members near the first one's topology domain when it prefers."""
        mark = self.state.mark()
        used = set(used)
        takes: list[Take] = []
        pack = 0.0 if self._frag_index and self._w_frag else self._kind(job.kind).pack
        for _ in range(shape.members):
            got = self._best(shape, sid, shape.per_node, allowed, used, domain, pack)
            if got is None:
                self.state.rollback(mark)
                return None
            idx, choice = got
            takes.append(self._take(job, idx, choice, shape))
            used.add(idx)
            if shape.is_gang and shape.prefer_topology and domain is None:
                domain = self.state.nodes[idx].topology
        return takes

    def able_by_domain(self, shape: Shape, sid: int, allowed: frozenset, exclude: set[int]) -> dict[str, list[int]]:
        """Topology domain → the nodes in it (outside `exclude`) that could take one member of the gang now."""
        out: dict[str, list[int]] = {}
        nodes = self.state.nodes
        per_node = shape.per_node if shape.members else 1
        for cid in self._classes_for(shape, allowed):
            for key, bucket in self.state.groups.get(cid, {}).items():
                if not self._choices(cid, key[0], shape, sid, per_node, allowed, "first"):
                    continue
                for idx in bucket:
                    ns = nodes[idx]
                    if ns.topology and idx not in exclude and ns.host_fits(shape.cpu, shape.mem):
                        out.setdefault(ns.topology, []).append(idx)
        return out

    def _gang_domain(self, shape: Shape, sid: int, allowed: frozenset,
                     exclude: set[int]) -> tuple[str, list[int]] | None:
        """The rack for a gang of `shape.members` nodes: of those where every member fits now, the one with the
        fewest such nodes (big racks stay whole for big gangs), then by name; else the block (the racks sharing
        a `block/` prefix) that fits, the same way; None when no domain holds the gang."""
        able = self.able_by_domain(shape, sid, allowed, exclude)
        for level in (able, _by_block(able)):
            fitting = sorted((len(v), d) for d, v in level.items() if len(v) >= shape.members)
            if fitting:
                d = fitting[0][1]
                return d, level[d]
        return None

    def _place_opened(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
                      opened: list[int]) -> list[Take] | None:
        """Place the job with the held nodes `opened` usable (held again afterwards; the caller's placement failed
        without them). A one-node job can then only go to one of them: when none has room, nothing is opened."""
        if shape.members == 1 and not any(self._fits_node(i, shape, sid, allowed) for i in opened):
            return None
        for i in opened:
            self.state.set_hidden(i, False)
        takes = self._place(job, shape, sid, allowed)
        for i in opened:
            self.state.set_hidden(i, True)
        return takes

    def _fits_node(self, idx: int, shape: Shape, sid: int, allowed: frozenset) -> bool:
        ns = self.state.nodes[idx]
        if not ns.schedulable or not ns.host_fits(shape.cpu, shape.mem) or not shape.selector <= ns.labels:
            return False
        dyn = tuple(g.dyn() for g in ns.gpus)
        return bool(self._choices(ns.cls, dyn, shape, sid, shape.per_node, allowed, "first"))

    def _amount(self, shape: Shape, model: str) -> int:
        if shape.kind == MIG_KIND:
            p = migcat.profile(model, shape.profile)
            return p.milli if p else 0
        return shape.gpu_milli_total()

    def _allowed_amounts(self, shape: Shape, sid: int, allowed: frozenset) -> tuple[tuple[tuple[str, int], ...], int]:
        """What the shape would take of each model in `allowed` (sorted by model), and the most of those (its
        demand): fixed for the cluster's models, so kept."""
        key = (sid, allowed)
        got = self._allowed_memo.get(key)
        if got is None:
            if len(self._allowed_memo) > 100_000:
                self._allowed_memo.clear()
            amounts = tuple((m, self._amount(shape, m)) for m in sorted(allowed))
            got = self._allowed_memo[key] = (amounts, max((a for _, a in amounts), default=0))
        return got

    def _models_for(self, shape: Shape) -> tuple[str, ...]:
        """The cluster's GPU models that could serve the shape (by its models, memory, MIG profile): kept."""
        got = self._models_memo.get(shape)
        if got is None:
            if len(self._models_memo) > 100_000:
                self._models_memo.clear()
            got = self._models_memo[shape] = tuple(self._models_of(shape))
        return got

    def _models_of(self, shape: Shape) -> list[str]:
        if shape.kind == CPU_KIND:
            return list(self._models)
        out = []
        for m in self._models:
            if shape.models and m not in shape.models:
                continue
            if self._model_mem.get(m, 0) < shape.min_mem:
                continue
            if shape.kind == MIG_KIND and shape.profile not in migcat.profiles_for(m):
                continue
            out.append(m)
        return out

    def _take_milli(self, t: Take) -> dict[str, int]:
        ns = self.state.nodes[t.node]
        out: dict[str, int] = {}
        for pos in t.positions:
            g = ns.gpus[pos]
            milli = g.mig_profiles[t.mig[0]].milli if t.mig else t.milli
            out[g.model] = out.get(g.model, 0) + milli
        return out

    def _domain_wait(self, shape: Shape, sid: int, allowed: frozenset) -> dict:
        """For a waiting gang that prefers one topology domain, the domain closest to holding it (the most nodes
        able to take a member now, then by name): rack r1 with 1 node ('' when no rack has one)."""
        if not (shape.prefer_topology and shape.members > 1 and self.state.topologies):
            return {}
        able = self.able_by_domain(shape, sid, allowed, set())
        if not able:
            return {"domain_kind": "rack"}
        n, d = min((-len(v), d) for d, v in able.items())
        return {"domain_kind": "rack", "domain": d, "domain_nodes": -n}

    def _why(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
             reserved: dict) -> tuple[str, ReasonFacts]:
        """Why the job does not fit now: its reason code and facts."""
        st = self.state
        ask = {"ask": shape.describe(), "cpu_milli": shape.cpu, "memory_mib": shape.mem}
        if shape.selector and not any(ns.schedulable and shape.selector <= ns.labels for ns in st.nodes):
            return NO_NODE_MATCHES_SELECTOR, ReasonFacts(cause="selector", labels=tuple(sorted(shape.selector)),
                                                         **ask, **self._census(shape, sid, allowed))
        if reserved:
            opened = list(reserved)
            mark = st.mark()
            fits = bool(self._place_opened(job, shape, sid, allowed, opened))
            st.rollback(mark)
            if fits:
                holders = tuple(sorted({reserved[i][0] for i in opened}))
                return RESERVED_FOR_GANG, ReasonFacts(cause="reserved", holders=holders, **ask)
        if shape.is_gang:
            n_ok = 0
            for cid in self._classes_for(shape, allowed):
                for key, bucket in st.groups.get(cid, {}).items():
                    if self._choices(cid, key[0], shape, sid, shape.per_node if shape.members else 1, allowed,
                                     "first"):
                        n_ok += len(bucket)
            need = shape.members or shape.total
            return WAITING_FOR_GANG, ReasonFacts(cause="gang", nodes_able=n_ok, nodes_needed=need, **ask,
                                                 **self._domain_wait(shape, sid, allowed),
                                                 **self._census(shape, sid, allowed))
        return NO_FEASIBLE_NODE, ReasonFacts(cause="no_room", **ask, **self._census(shape, sid, allowed))


def _nearness(topology: str, domain: str) -> float:
    """1 for the same topology domain, 0.5 for another rack of the same block (`block/rack`), else 0."""
    if topology == domain:
        return 1.0
    block, sep, _ = domain.rpartition("/")
    return 0.5 if sep and topology.rpartition("/")[0] == block else 0.0


def _by_block(able: dict[str, list[int]]) -> dict[str, list[int]]:
    """The same nodes by block (the part of `block/rack` before the '/'); racks without a block left out."""
    out: dict[str, list[int]] = {}
    for d, v in sorted(able.items()):
        block, sep, _ = d.rpartition("/")
        if sep:
            out.setdefault(block, []).extend(v)
    return out


def _could_run(cls, s: tuple) -> bool:
    """An empty node of class `cls` could run scarce shape `s` = (GPUs, models or None, CPU, memory)."""
    gpus, models, cpu, mem = s
    if (cls.cpu_cap and cls.cpu_cap < cpu) or (cls.mem_cap and cls.mem_cap < mem):
        return False
    return sum(1 for st in cls.gpus if st[5] and st[2] != MIG and (models is None or st[0] in models)) >= gpus


def _can_run_now(cls, dyn: tuple, ns, cpu_used: int, mem_used: int, s: tuple) -> bool:
    """Node `ns` (free state `dyn`), after `cpu_used`/`mem_used` more are taken, can run scarce shape `s` now."""
    gpus, models, cpu, mem = s
    if not ns.host_fits(cpu + cpu_used, mem + mem_used):
        return False
    n = 0
    for st, d in zip(cls.gpus, dyn, strict=True):
        if d is None or st[2] == MIG or (models is not None and st[0] not in models):
            continue
        if (d if st[2] != FRACTIONAL else d[0]) == WHOLE:
            n += 1
    return n >= gpus
