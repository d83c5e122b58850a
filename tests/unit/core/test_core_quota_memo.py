"""The quota ledger answers admission once per kind of ask and ledger version, and once for every model whose
entries read alike (a wildcard entry counts every model the same). The answers must be exactly those of asking
each model on its own, at every version, also after a tentative change is rolled back; and the quota-preemption
search's memo (candidates and whether releasing them admits the job) must not change any plan."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from core_builders import job, node, running, snapshot

from libs.core import Policy, Scheduler, teams_quota
from libs.core import blocked as blocked_mod
from libs.core import preempt as preempt_mod
from libs.core.plan import QuotaFacts, ReasonFacts, with_considered
from libs.core.policy import QuotaEntry, QuotaTree
from libs.core.quota import QuotaLedger

MODELS = ("A100", "H100", "L40S")
TEAMS = ("t0", "t1", "t2")


def _tree(rng: random.Random) -> QuotaTree:
    entries = []
    for team in TEAMS:
        for model in rng.sample(("*",) + MODELS, rng.randint(0, 2)):
            entries.append(QuotaEntry(f"org/{team}", rng.randint(0, 8), model,
                                      borrowing_limit=rng.choice((None, 0, 2, 6)),
                                      lending_limit=rng.choice((None, 0, 3))))
        if rng.random() < 0.4:
            entries.append(QuotaEntry(f"org/{team}/p0", rng.randint(0, 4), rng.choice(("*",) + MODELS)))
    if rng.random() < 0.5:
        entries.append(QuotaEntry("org", rng.randint(4, 20), rng.choice(("*",) + MODELS), borrowing_limit=4))
    # duplicates of (path, model) would make the tree ambiguous: keep the first of each
    seen: dict[tuple[str, str], QuotaEntry] = {}
    for e in entries:
        seen.setdefault((e.path, e.gpu_model), e)
    return QuotaTree(entries=tuple(seen.values()), team_org=tuple((t, "org") for t in TEAMS), default_org="org")


def _direct(ledger: QuotaLedger, paths, amounts, g_only):
    allowed, first = [], None
    for m, a in amounts:
        got = ledger.refusal_facts(paths, m, a, guarantee_only=g_only)
        if got is None:
            allowed.append(m)
        elif first is None:
            first = got
    return allowed, first


@pytest.mark.parametrize("seed", range(25))
def test_admission_is_each_models_own_answer_at_every_version(seed):
    rng = random.Random(seed)
    strict = rng.random() < 0.3
    ledger = QuotaLedger(_tree(rng), {m: 16_000 for m in MODELS}, strict)
    checked = refused = 0
    for _ in range(60):
        paths = ledger.paths(rng.choice(TEAMS), rng.choice(("p0", "p1")))
        milli = rng.choice((500, 1000, 2000, 4000))
        amounts = tuple((m, milli) for m in sorted(rng.sample(MODELS, rng.randint(1, 3))))
        g_only = rng.random() < 0.5
        got = ledger.admission(paths, amounts, guarantee_only=g_only)
        assert got == _direct(ledger, paths, amounts, g_only)
        assert ledger.refusing_paths(paths, amounts, "j", guarantee_only=g_only) == {
            f.path for m, a in amounts if (f := ledger.refusal_facts(paths, m, a, guarantee_only=g_only))}
        checked += 1
        refused += got[1] is not None
        step = rng.random()
        if step < 0.5:  # the usage moves on
            ledger.add(paths, rng.choice(MODELS), rng.choice((1000, 2000)))
        elif step < 0.7:  # a tentative change, undone: the old version names the old content again
            v, m = ledger.version, rng.choice(MODELS)
            ledger.add(paths, m, 3000)
            assert ledger.admission(paths, amounts, guarantee_only=g_only) == _direct(ledger, paths, amounts, g_only)
            ledger.add(paths, m, -3000)
            ledger.restore(v)
            assert ledger.admission(paths, amounts, guarantee_only=g_only) == _direct(ledger, paths, amounts, g_only)
    assert checked == 60
    assert refused > 0 or not ledger.has_entries  # the answers were not all "admitted"


def _case(seed: int):
    rng = random.Random(seed)
    nodes = [node(f"n{i}", 4, cpu=64000, mem=262144) for i in range(4)]
    busy = [running(f"r{i}", f"n{i % 4}", [i // 4], team=rng.choice("ab"),
                    priority_class=rng.choice(("normal", "low", "best-effort")),
                    started=rng.choice((0.0, 1000.0, 3000.0))) for i in range(14)]
    queue = [job(f"q{i:02d}", rng.choice((1, 2)), team=rng.choice("abc"), priority_class=rng.choice(("high", "normal")),
                 at=float(rng.randint(0, 3000)), cpu_milli=rng.choice((1000, 2000))) for i in range(60)]
    return snapshot(nodes, running=busy), queue


@pytest.mark.parametrize("seed", range(6))
def test_quota_preemption_memo_leaves_the_plan_unchanged(seed, monkeypatch):
    snap, queue = _case(seed)
    policy = Policy(quotas=teams_quota({"a": 3, "b": 3, "c": 2}))
    searched = []
    real = blocked_mod.find_quota_victims

    def spy(*args, **kw):
        got = real(*args, **kw)
        searched.append(got.considered)
        return got

    monkeypatch.setattr(blocked_mod, "find_quota_victims", spy)
    with_memo = Scheduler(snap, policy).cycle(queue, 3600.0)
    assert searched and max(searched) > 0  # quota searches ran and weighed candidates
    monkeypatch.setattr(blocked_mod, "find_quota_victims", lambda *a, **kw: real(*a[:7]))  # no memo
    without = Scheduler(snap, policy).cycle(queue, 3600.0)
    assert with_memo.placements == without.placements
    assert with_memo.preemptions == without.preemptions
    assert with_memo.pending == without.pending


def test_the_fast_considered_copy_equals_dataclasses_replace():
    facts = ReasonFacts(cause="no_room", ask="2 GPUs", cpu_milli=4000, filtered=(("gpu_model", 3),),
                        quota=QuotaFacts("org/a", "*", "lending", used_milli=2000), victims_considered=1,
                        reservation_start=12.5, detail="x")
    copy = with_considered(facts, 7)
    assert copy == replace(facts, victims_considered=7)
    assert copy.victims_considered == 7 and facts.victims_considered == 1


def test_skipping_releases_where_no_node_could_take_the_job_leaves_the_plan_unchanged(monkeypatch):
    policy = Policy(quotas=teams_quota({"a": 3, "b": 3, "c": 2}))
    real, room = blocked_mod.find_quota_victims, preempt_mod._room_anywhere
    skipped = []
    for seed in range(6):
        snap, queue = _case(seed)
        queue += [job(f"big{i}", 4, team="a", priority_class="high", at=10.0 + i, cpu_milli=48000) for i in range(3)]
        monkeypatch.setattr(preempt_mod, "_room_anywhere", lambda *a: skipped.append(not (r := room(*a))) or r)
        monkeypatch.setattr(blocked_mod, "find_quota_victims", real)
        with_check = Scheduler(snap, policy).cycle(queue, 3600.0)
        monkeypatch.setattr(blocked_mod, "find_quota_victims",
                            lambda st, c, pre, *a: real(st, c, replace(pre, shape=None), *a))  # always release
        without = Scheduler(snap, policy).cycle(queue, 3600.0)
        assert with_check.placements == without.placements
        assert with_check.preemptions == without.preemptions
        assert with_check.pending == without.pending
    assert sum(skipped) >= 3  # searches were cut short: no node had room even with their victims gone
