"""Quota ledger over the org -> team -> project tree, per GPU model, in milli-GPUs.

Admission of `amount` of model `m` for a job walks its path (project, team, org). At each level with an entry:

1. usage + amount must stay within guaranteed + borrowing_limit (when a limit is set);
2. what the level would use above its guarantee, plus what its siblings already borrow, must be covered by the
   siblings' unused guarantees (each capped by its lending_limit) plus the parent's capacity that no child is
   guaranteed (for orgs: the cluster's capacity of that model minus all org guarantees).

Borrowed usage (above guarantee) is what reclaim may preempt when a team under its guarantee is waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from libs.core.explain import quota_text
from libs.core.plan import QuotaFacts
from libs.core.policy import QuotaEntry, QuotaTree

INF = math.inf


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


class QuotaLedger:
    def __init__(self, tree: QuotaTree, capacity: dict[str, int], strict: bool = False):
        self.tree = tree
        self.capacity = capacity
        self.strict = strict
        self.entries: dict[tuple[str, str], QuotaEntry] = {(e.path, e.gpu_model): e for e in tree.entries}
        self.children: dict[tuple[str, str], list[QuotaEntry]] = {}
        for e in tree.entries:
            self.children.setdefault((_parent(e.path), e.gpu_model), []).append(e)
        self.usage: dict[tuple[str, str], int] = {}
        self.version = 0  # a new value at every change of usage: answers remembered at one version hold while it does
        self._ticks = 0  # versions handed out (never reused, so a version names one content of `usage`)
        self.has_entries = bool(tree.entries)
        self._paths: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._unassigned: dict[tuple[str, str], int] = {}  # (parent, model) -> its pool no child is guaranteed
        self._sibling_sums: dict[tuple[str, str], tuple[int, tuple[int, float, int]]] = {}  # -> (version, sums)
        self._refusal_memo: dict[tuple, tuple[int, tuple]] = {}  # (paths, amounts, guarantee only) -> (version, ...)
        self._signatures: dict[tuple, tuple] = {}  # (paths, model, guarantee only) -> `_signature`
        self._team_terms: dict[tuple[str, str], tuple[str, int] | None] = {}  # (team path, model) -> its terms

    @classmethod
    def holding(cls, tree: QuotaTree, capacity: dict[str, int], strict: bool,
                held: Mapping[tuple[str, str, str], int]) -> QuotaLedger:
        """A ledger with what runs already counted: `held` is (team, project, model) -> milli-GPUs."""
        ledger = cls(tree, capacity, strict)
        if ledger.has_entries:
            for (team, project, model), milli in held.items():
                ledger.add(ledger.paths(team, project), model, milli)
        return ledger

    def admissible(self, paths: tuple[str, str, str], amounts: Iterable[tuple[str, int]], job_id: str, *,
                   guarantee_only: bool) -> tuple[list[str], str | None]:
        """Quota admission of one job over the GPU models it may use (`amounts`: model -> milli it would take):
        the models it may take now, and the first refusal's message. `guarantee_only`: non-preemptible work may
        not borrow (what is borrowed must stay reclaimable), so it must fit its team's guarantee."""
        allowed, first = self.admission(paths, amounts, guarantee_only=guarantee_only)
        return allowed, quota_text(job_id, first) if first is not None else None

    def admission(self, paths: tuple[str, str, str], amounts: Iterable[tuple[str, int]], *,
                  guarantee_only: bool) -> tuple[list[str], QuotaFacts | None]:
        """`admissible` with the first refusal as facts (`explain.quota_text` says them)."""
        if not self.has_entries and not guarantee_only:  # no quota at all: every model, as `refusal_facts` says
            return [m for m, _ in amounts], None
        allowed: list[str] = []
        first: QuotaFacts | None = None
        for model, got in self._refusals(paths, amounts, guarantee_only):
            if got is None:
                allowed.append(model)
            elif first is None:
                first = got
        return allowed, first

    def _refusals(self, paths: tuple[str, str, str], amounts: Iterable[tuple[str, int]],
                  guarantee_only: bool) -> tuple[tuple[str, QuotaFacts | None], ...]:
        """Each model of `amounts` with its refusal (None: admissible), kept for the ledger's version (a version
        names one content of `usage`, so an answer at it holds whenever the ledger is back at it)."""
        amounts = tuple(amounts)
        key = (paths, amounts, guarantee_only)
        hit = self._refusal_memo.get(key)
        if hit is not None and hit[0] == self.version:
            return hit[1]
        seen: dict[tuple, QuotaFacts | None] = {}  # models whose entries and amount agree get one answer
        out = []
        for m, a in amounts:
            k = (self._signature(paths, m, guarantee_only), a)
            if k in seen:
                got = seen[k]
            else:
                got = seen[k] = self.refusal_facts(paths, m, a, guarantee_only=guarantee_only)
            out.append((m, got))
        got_all = tuple(out)
        self._refusal_memo[key] = (self.version, got_all)
        return got_all

    def _signature(self, paths: tuple[str, str, str], model: str, guarantee_only: bool) -> tuple:
        """What `refusal_facts` reads of `model`: the entry at each level of `paths` (a wildcard entry counts every
        model alike), and the model itself only where a refusal would name it (no entry at the team level for a
        guarantee-only job, or no entry anywhere under a strict quota)."""
        key = (paths, model, guarantee_only)
        sig = self._signatures.get(key)
        if sig is None:
            entries = tuple(self.entry(p, model) for p in paths)
            named = (guarantee_only and entries[1] is None) or (self.strict and all(e is None for e in entries))
            sig = self._signatures[key] = (tuple(id(e) for e in entries), model if named else None)
        return sig

    def refusal(self, paths: tuple[str, str, str], model: str, amount: int, job_id: str, *,
                guarantee_only: bool) -> tuple[str, str] | None:
        """None when `amount` of `model` is admissible, else (the path of the level that refuses, why)."""
        got = self.refusal_facts(paths, model, amount, guarantee_only=guarantee_only)
        return None if got is None else (got.path, quota_text(job_id, got))

    def refusal_facts(self, paths: tuple[str, str, str], model: str, amount: int, *,
                      guarantee_only: bool) -> QuotaFacts | None:
        """None when `amount` of `model` is admissible, else the refusal of the level that refuses."""
        got = self.check_facts(paths, model, amount)
        if got is None and guarantee_only and amount and not self.within_guarantee(paths, model, amount):
            e = self.entry(paths[1], model)
            g = self.guaranteed(paths[1], model)
            got = QuotaFacts(paths[1], e.gpu_model if e else model, "guarantee_only",
                             used_milli=self.team_used(paths[1], model), asked_milli=amount, limit_milli=g,
                             guaranteed_milli=g)
        return got

    def refusing_paths(self, paths: tuple[str, str, str], amounts: Iterable[tuple[str, int]], job_id: str, *,
                       guarantee_only: bool) -> set[str]:
        """The levels of the job's path that refuse it, over the models it may use."""
        return {got.path for _, got in self._refusals(paths, amounts, guarantee_only) if got is not None}

    def paths(self, team: str, project: str) -> tuple[str, str, str]:
        key = (team, project)
        p = self._paths.get(key)
        if p is None:
            p = self._paths[key] = self.tree.path_of(team, project)
        return p

    def entry(self, path: str, model: str) -> QuotaEntry | None:
        return self.entries.get((path, model)) or self.entries.get((path, "*"))

    def add(self, paths: tuple[str, ...], model: str, milli: int) -> None:
        if not self.has_entries or milli == 0:
            return
        self._ticks += 1
        self.version = self._ticks
        u = self.usage
        for p in paths:
            u[(p, model)] = u.get((p, model), 0) + milli
            u[(p, "*")] = u.get((p, "*"), 0) + milli

    def used(self, path: str, key_model: str) -> int:
        return self.usage.get((path, key_model), 0)

    def guaranteed(self, path: str, model: str) -> int:
        e = self.entry(path, model)
        return int(e.guaranteed * 1000) if e else 0

    def borrowed(self, path: str, model: str) -> int:
        e = self.entry(path, model)
        if e is None:
            return self.used(path, model)  # no guarantee for the model: everything it uses of it is borrowed
        return max(0, self.used(path, e.gpu_model) - int(e.guaranteed * 1000))

    def team_used(self, path: str, model: str) -> int:
        """What `path` uses that counts against its quota for `model`: that model's GPUs, or every model's where
        its entry is a wildcard."""
        e = self.entry(path, model)
        return self.used(path, e.gpu_model if e else model)

    def restore(self, version: int) -> None:
        """Every change since `version` was undone (a tentative search put usage back as it was): the version it
        had then names its content again."""
        self.version = version

    def remove(self, paths: tuple[str, ...], milli_by_model: Mapping[str, int]) -> None:
        """Take a job's use out (a tentative preemption); `add` it back to undo."""
        for model, milli in milli_by_model.items():
            self.add(paths, model, -milli)

    def within_guarantee(self, paths: tuple[str, ...], model: str, milli: int) -> bool:
        """True when the team level (paths[1]) would stay within its guarantee after taking `milli`."""
        key = (paths[1], model)
        terms = self._team_terms.get(key, ())
        if terms == ():  # the team entry's counted model and guarantee: fixed for the ledger's life
            e = self.entry(paths[1], model)
            terms = self._team_terms[key] = None if e is None else (e.gpu_model, int(e.guaranteed * 1000))
        if terms is None:
            return False
        return self.usage.get((paths[1], terms[0]), 0) + milli <= terms[1]

    def check(self, paths: tuple[str, ...], model: str, milli: int) -> str | None:
        """None when admissible, else a message for a `QuotaExceeded` reason."""
        got = self.check_at(paths, model, milli)
        return got[1] if got else None

    def check_at(self, paths: tuple[str, ...], model: str, milli: int) -> tuple[str, str] | None:
        """None when admissible, else (the path of the first level that refuses, why). Counts are of what the
        level's entry covers: the model's GPUs, or every model's for a wildcard entry ("GPUs of any model")."""
        got = self.check_facts(paths, model, milli)
        return None if got is None else (got.path, quota_text("", got))

    def check_facts(self, paths: tuple[str, ...], model: str, milli: int) -> QuotaFacts | None:
        """`check_at`'s refusal as facts."""
        if not self.has_entries:
            return None
        any_entry = False
        for path in reversed(paths):  # project, team, org
            e = self.entry(path, model)
            if e is None:
                continue
            any_entry = True
            km = e.gpu_model
            used = self.used(path, km)
            g = int(e.guaranteed * 1000)
            if e.borrowing_limit is not None and used + milli > g + int(e.borrowing_limit * 1000):
                return QuotaFacts(path, km, "borrowing_limit", used_milli=used, asked_milli=milli,
                                  limit_milli=g + int(e.borrowing_limit * 1000), guaranteed_milli=g)
            if used + milli > g:
                avail = self._borrowable(path, km, e, used + milli)
                need = used + milli - g
                if need > avail:
                    return QuotaFacts(path, km, "lending", used_milli=used, asked_milli=milli,
                                      limit_milli=g + max(int(avail), 0), guaranteed_milli=g)
        if self.strict and not any_entry:
            return QuotaFacts(paths[1], model, "no_quota", asked_milli=milli)
        return None

    def _borrowable(self, path: str, km: str, me: QuotaEntry, my_use: int) -> float:
        parent = _parent(path)
        unassigned, lend, borrowed_by_others = self._siblings(parent, km)
        g = int(me.guaranteed * 1000)  # the sums are over every sibling: take `me`'s own terms back out
        u = self.used(me.path, km)
        unused = max(0, g - u)
        if me.lending_limit is not None:
            unused = min(unused, int(me.lending_limit * 1000))
        return (lend - unused) + max(0.0, unassigned) - (borrowed_by_others - max(0, u - g))

    def _siblings(self, parent: str, km: str) -> tuple[int, float, int]:
        """For the children of `parent` with entries for `km`: the parent's pool no child is guaranteed, what they
        lend (unused guarantees, each capped by its lending limit) and what they borrow, summed at this version
        (whole milli-GPUs, so taking one child's terms back out is exact)."""
        key = (parent, km)
        hit = self._sibling_sums.get(key)
        version = self.version
        if hit is not None and hit[0] == version:
            return hit[1]
        siblings = self.children.get(key, [])
        unassigned = self._unassigned.get(key)
        if unassigned is None:
            cluster = self.capacity.get(km, 0) if km != "*" else sum(self.capacity.values())
            pe = self.entries.get(key) if parent else None
            if pe is None or pe.borrowing_limit is None:  # root, a parent without an entry or a limit: the cluster
                pool = cluster
            else:
                pool = min(cluster, int((pe.guaranteed + pe.borrowing_limit) * 1000))
            unassigned = self._unassigned[key] = pool - sum(int(s.guaranteed * 1000) for s in siblings)
        lend = 0.0
        borrowed = 0
        for s in siblings:
            g = int(s.guaranteed * 1000)
            u = self.used(s.path, km)
            unused = max(0, g - u)
            if s.lending_limit is not None:
                unused = min(unused, int(s.lending_limit * 1000))
            lend += unused
            borrowed += max(0, u - g)
        got = (unassigned, lend, borrowed)
        self._sibling_sums[key] = (version, got)
        return got

def teams_quota(guarantees: dict[str, float], gpu_model: str = "*", org: str = "default",
                lending_limit: float | None = None, borrowing_limit: float | None = None) -> QuotaTree:
    """A flat tree: one org, one entry per team (handy for tests and the simulator)."""
    return QuotaTree(
        entries=tuple(
            QuotaEntry(f"{org}/{team}", g, gpu_model, borrowing_limit=borrowing_limit, lending_limit=lending_limit)
            for team, g in sorted(guarantees.items())
        ),
        team_org=tuple((t, org) for t in sorted(guarantees)),
        default_org=org,
    )
