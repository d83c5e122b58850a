"""Policy: priority classes, the quota tree, scorer weights and switches. Plain values; `Policy(name=...)` picks a
preset (`fifo`, `best-fit`, `default`) and any field may be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """Priority and preemptibility are separate: a high class may still be preemptible, and the reverse."""

    name: str
    value: int
    preemptible: bool
    min_runtime_s: float | None = None  # None: the policy's min_runtime_s


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("production-inference", 1000, preemptible=False),
    PriorityClass("high", 100, preemptible=False),
    PriorityClass("normal", 0, preemptible=True),
    PriorityClass("low", -50, preemptible=True),
    PriorityClass("best-effort", -100, preemptible=True, min_runtime_s=60.0),
)


@dataclass(frozen=True, slots=True)
class KindPolicy:
    """What a job kind changes (the tiers of a GPU platform), as data a `Policy` may replace.

    * `preemptible=False` protects the kind: its jobs are not preemptible unless the job itself says so (a priority
      class that is not preemptible protects too; None: the class decides).
    * `reserve`: a blocked job of this kind may hold nodes (a backfill reservation); without it the job only runs
      where it delays nobody.
    * `spread_replicas`: jobs naming a `replica_group` go to nodes, then topology domains, without another member
      of the group (soft: packed together only when nothing else fits).
    * `pack`: extra bin-packing weight in the score (fill partly used nodes, keep whole nodes free).
    * `prefer_shared`: whole-GPU requests prefer shareable (fractional) GPUs, keeping exclusive nodes for training.
    """

    kind: str
    preemptible: bool | None = None
    reserve: bool = True
    spread_replicas: bool = False
    pack: float = 0.0
    prefer_shared: bool = False


DEFAULT_KINDS: tuple[KindPolicy, ...] = (
    # gangs, preemptible by default (the default class is), NVLink/rack-local, packed so whole nodes stay whole
    KindPolicy("training", pack=0.3),
    # serving: not preemptible by default; replicas of one service spread over nodes and racks for availability
    KindPolicy("inference", preemptible=False, spread_replicas=True),
    # interactive sessions: the shared pool first, packed tightly
    KindPolicy("dev", pack=1.0, prefer_shared=True),
    # best effort: never holds nodes for itself, runs only where it delays nobody (backfill)
    KindPolicy("batch", reserve=False),
)


@dataclass(frozen=True, slots=True)
class QuotaEntry:
    """Quota of one node of the org -> team -> project tree for one GPU model (``"*"``: any model), in GPUs.

    Usage above `guaranteed` is borrowed (from siblings' unused guarantee, up to their `lending_limit`, and from
    capacity nobody is guaranteed) and may be reclaimed. `borrowing_limit` caps borrowing (None: unlimited);
    `weight` scales the fair share of capacity beyond guarantees.
    """

    path: str  # "org", "org/team" or "org/team/project"
    guaranteed: float = 0.0
    gpu_model: str = "*"
    borrowing_limit: float | None = None
    lending_limit: float | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class QuotaTree:
    entries: tuple[QuotaEntry, ...] = ()
    team_org: tuple[tuple[str, str], ...] = ()  # team -> org; teams not listed belong to `default_org`
    default_org: str = "default"

    def path_of(self, team: str, project: str) -> tuple[str, str, str]:
        org = dict(self.team_org).get(team, self.default_org)
        return (org, f"{org}/{team}", f"{org}/{team}/{project}")


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """One kind of request and how common it is: the fragmentation scorer measures a node against these."""

    gpus: int
    gpu_milli: int = 1000  # per GPU; < 1000 only with gpus == 1
    weight: float = 1.0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    mig_profile: str = ""


_PRESETS: dict[str, dict] = {
    # FIFO by submit time, first fit, head-of-line blocking (no backfill), no preemption, no fair share.
    "fifo": dict(
        order="fifo", fit="first", head_of_line=True, preemption=False, backfill=False,
        w_binpack=0.0, w_spread=0.0, w_topology=0.0, w_frag=0.0, frag_ties="score", typical_mix=False,
        typical_coverage=0.95, scarce_hosts=0,
    ),
    # Priority then submit time; the node (and GPU) left with the least free capacity; no preemption.
    "best-fit": dict(
        order="priority", fit="score", head_of_line=False, preemption=False, backfill=False,
        w_binpack=1.0, w_spread=0.0, w_topology=0.0, w_frag=0.0, frag_ties="score", typical_mix=False,
        typical_coverage=0.95, scarce_hosts=0,
    ),
    # gpupool: priority -> fair share -> submit -> id; fragmentation scored as FGD's artifact scores it (whole
    # numbers, int(sigmoid(fall of the expected fragmentation in GPUs) x 100), ties to the lowest node index, which
    # packs) against the most common exact requests (FGD's typical requests, not cut at 95%); a request without
    # GPUs goes, among tied choices, to the node whose GPUs are the most in use (`frag_ties="busy"`); the last node
    # able to run a shape of the workload (`scarce_hosts`) is not broken by smaller work that fits elsewhere;
    # topology as a tie-break inside one whole point; reservations with backfill; preemption within teams and to
    # reclaim guarantees.
    "default": dict(
        order="fair", fit="score", head_of_line=False, preemption=True, backfill=True,
        w_binpack=0.0, w_spread=0.0, w_topology=0.3, w_frag=1.0, frag_ties="busy", typical_mix=True,
        typical_coverage=1.0, scarce_hosts=2,
    ),
    # FGD as published: as default without the topology weight, scarce hosts or busy-node ties (every tie to the
    # lowest index), against FGD's typical requests cut at 95% of the jobs (CPU-only ones included).
    "fgd": dict(
        order="fair", fit="score", head_of_line=False, preemption=True, backfill=True,
        w_binpack=0.0, w_spread=0.0, w_topology=0.0, w_frag=1.0, frag_ties="index", typical_mix=True,
        typical_coverage=0.95, scarce_hosts=0,
    ),
    "spread": dict(
        order="fair", fit="score", head_of_line=False, preemption=True, backfill=True,
        w_binpack=0.0, w_spread=1.0, w_topology=0.3, w_frag=0.0, frag_ties="score", typical_mix=False,
        typical_coverage=0.95, scarce_hosts=0,
    ),
}


@dataclass(frozen=True, slots=True)
class Policy:
    name: str = "default"
    order: str | None = None  # "fifo" | "priority" | "fair"
    fit: str | None = None  # "first" | "score"
    head_of_line: bool | None = None
    preemption: bool | None = None
    backfill: bool | None = None
    w_binpack: float | None = None
    w_spread: float | None = None
    w_topology: float | None = None
    w_frag: float | None = None
    # "score": the fall in fragmentation is a continuous score and packing breaks near-ties toward the fuller node;
    # "index": FGD's whole-number score, ties to the lowest node index, the kinds' packing weights unused while
    # fragmentation is scored (w_frag > 0); "busy": as "index", but a request without GPUs goes, among tied
    # choices, to the node whose GPUs are the most in use first (it needs none of them, so it takes host CPU and
    # memory where the GPUs are taken already, not where GPU work still needs them)
    frag_ties: str | None = None
    # The mix fragmentation is measured against. False: the most common GPU shapes, each by how often it occurs
    # (`derive_workload`; rare big shapes keep their weight). True: FGD's typical requests (`derive_typical`): the
    # exact requests covering `typical_coverage` of the jobs with CPU-only ones, each by its share of all jobs —
    # FGD's published fill at 0.95, where rare big shapes drop out (to weight 0: `scarce_hosts` still knows them).
    typical_mix: bool | None = None
    # With `typical_mix`: the share of all jobs the typical requests cover, most common first (FGD's 0.95; 1.0:
    # every exact request, up to 2 x max_workload_shapes of them), each still weighted by its share of all jobs.
    typical_coverage: float | None = None
    # Scarce hosts: when at most this many nodes can run a whole-GPU shape of the workload now (rare shapes too),
    # smaller work that fits on another node does not take the last of them (a preference before the score, not a
    # hold: work that fits nowhere else still goes there). 0: off.
    scarce_hosts: int | None = None
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    quotas: QuotaTree = field(default_factory=QuotaTree)
    strict_quota: bool = False  # True: a team without quota entries may not borrow at all
    fair_share_half_life_s: float = 7 * 24 * 3600.0
    min_runtime_s: float = 300.0
    max_reservations: int = 4
    # Score at most this many feasible node groups per decision, visited best first (0: all of them; the fill
    # experiment uses 0). Like Nomad's limit iterator and kube-scheduler's percentageOfNodesToScore.
    max_candidates: int = 16
    # A reservation whose start is unknown (running work has no max runtime) is a soft hold: other work avoids
    # its nodes while anything else fits. Only a job that has waited this long gets one (one such job at a time).
    drain_after_s: float = 3600.0
    # Preemption cost (libs/core/preempt.py): below this priority a job preempts by priority only once its own
    # waiting has cost as much GPU-time as its victims would lose (ski rental); at or above it, at once.
    preemption_cost: bool = True
    preempt_at_once_priority: int = 1000
    max_preemption_wait_s: float = 1800.0  # the rule never makes a job wait longer than this to preempt
    reclaim_min_runtime_s: float = 0.0  # borrowed work is reclaimed only after it ran this long (hysteresis)
    workload: tuple[WorkloadShape, ...] = ()  # empty: derived from the pending jobs of the cycle
    max_workload_shapes: int = 32
    kinds: tuple[KindPolicy, ...] = DEFAULT_KINDS  # a kind not listed gets KindPolicy(kind)'s neutral defaults
    # Non-preemptible work may use only its team's guarantee (when the policy has quotas): borrowed capacity must
    # stay reclaimable, so an idle team can always get its guarantee back (KAI's rule).
    nonpreemptible_within_guarantee: bool = True

    def kind(self, name: str) -> KindPolicy:
        for k in self.kinds:
            if k.kind == name:
                return k
        return KindPolicy(name)

    def setting(self, key: str):
        value = getattr(self, key)
        if value is not None:
            return value
        return _PRESETS.get(self.name, _PRESETS["default"])[key]


def preset_names() -> tuple[str, ...]:
    return tuple(_PRESETS)
