"""MIG profile catalogue and placement rules, after NVIDIA's MIG User Guide ("Supported MIG Profiles").

A MIG-capable GPU has 8 memory slices (slots 0..7) and 7 compute slices. A GPU instance of a profile occupies
`slots` consecutive memory slices starting at one of the profile's allowed `starts` (what
`nvidia-smi mig -lgipp` prints as `Placements: {0,2,4}:2`). A layout is valid when every instance starts at an
allowed slot, no two instances share a memory slice, and the compute slices add up to at most 7.

Sizes in MiB follow the profile names (the exact usable memory is a little lower on real hardware; the scheduler
only needs the catalogue to be consistent).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

SLOTS = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # e.g. "3g.40gb"
    compute: int  # compute slices (the "g" in the name)
    slots: int  # memory slices occupied
    starts: tuple[int, ...]  # memory slice where an instance may start
    memory_mib: int

    def mask(self, start: int) -> int:
        return ((1 << self.slots) - 1) << start

    @property
    def milli(self) -> int:
        """Share of a whole GPU in 1/1000, by compute slices: how quotas and fair share count a slice."""
        return self.compute * 1000 // COMPUTE_SLICES


def _family(mem_gb: tuple[int, int, int, int, int, int]) -> dict[str, MigProfile]:
    one, one_big, two, three, four, seven = mem_gb
    rows = (
        (f"1g.{one}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), one),
        (f"1g.{one_big}gb", 1, 2, (0, 2, 4, 6), one_big),
        (f"2g.{two}gb", 2, 2, (0, 2, 4), two),
        (f"3g.{three}gb", 3, 4, (0, 4), three),
        (f"4g.{four}gb", 4, 4, (0,), four),
        (f"7g.{seven}gb", 7, 8, (0,), seven),
    )
    return {name: MigProfile(name, g, s, starts, gb * 1024) for name, g, s, starts, gb in rows}


# GPU model name -> profile name -> profile. Model names are matched after `canonical_model`.
CATALOGUE: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _family((5, 10, 10, 20, 20, 40)),
    "A100-80GB": _family((10, 20, 20, 40, 40, 80)),
    "H100-80GB": _family((10, 20, 20, 40, 40, 80)),
    "H200-141GB": _family((18, 35, 35, 71, 71, 141)),
}

_ALIASES = {
    "A100": "A100-40GB",
    "A100-SXM4-40GB": "A100-40GB",
    "A100-PCIE-40GB": "A100-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-PCIE-80GB": "A100-80GB",
    "H100": "H100-80GB",
    "H100-SXM5-80GB": "H100-80GB",
    "H100-PCIE-80GB": "H100-80GB",
    "H200": "H200-141GB",
}


def canonical_model(model: str) -> str:
    key = model.upper().replace("NVIDIA ", "").replace(" ", "-")
    return _ALIASES.get(key, key)


@lru_cache(maxsize=1024)
def profiles_for(model: str) -> dict[str, MigProfile]:
    """The MIG profiles a GPU model supports; empty when the model is not MIG-capable (or not catalogued)."""
    return CATALOGUE.get(canonical_model(model), {})


def profile(model: str, name: str) -> MigProfile | None:
    return profiles_for(model).get(name)


def valid_layout(model: str, instances: Iterable[tuple[str, int]]) -> bool:
    """True when (profile name, start slot) instances form a layout the GPU accepts."""
    table = profiles_for(model)
    used = 0
    compute = 0
    for name, start in instances:
        p = table.get(name)
        if p is None or start not in p.starts:
            return False
        m = p.mask(start)
        if used & m:
            return False
        used |= m
        compute += p.compute
    return compute <= COMPUTE_SLICES


@lru_cache(maxsize=65536)
def free_starts(model: str, name: str, busy_mask: int) -> tuple[int, ...]:
    """Start slots where a new instance of `name` fits next to the instances occupying `busy_mask`."""
    p = profile(model, name)
    if p is None:
        return ()
    return tuple(s for s in p.starts if not (busy_mask & p.mask(s)))


@lru_cache(maxsize=65536)
def max_instances(model: str, name: str, busy_mask: int) -> int:
    """How many more instances of one profile fit in the free slots (greedy on the lowest start is optimal here
    because every profile's starts are aligned to its size)."""
    p = profile(model, name)
    if p is None:
        return 0
    count = 0
    mask = busy_mask
    for s in p.starts:
        if not (mask & p.mask(s)):
            mask |= p.mask(s)
            count += 1
    return count


def compute_used(model: str, instances: Iterable[tuple[str, int]]) -> int:
    table = profiles_for(model)
    return sum(table[name].compute for name, _ in instances if name in table)


def plan_gpu_layout(model: str, busy: Iterable[tuple[str, int]], wanted: Iterable[str]) -> list[tuple[str, int]]:
    """New instances to create on one GPU so as to serve as much of `wanted` (profile names, largest first wins)
    as fits next to the `busy` instances, which are never moved. Returns (profile, start) pairs; the result together
    with `busy` is always a valid layout."""
    table = profiles_for(model)
    busy = list(busy)
    mask = 0
    compute = 0
    for name, start in busy:
        mask |= table[name].mask(start)
        compute += table[name].compute
    created: list[tuple[str, int]] = []
    for name in sorted(wanted, key=lambda n: (-table[n].slots if n in table else 0, n)):
        p = table.get(name)
        if p is None or compute + p.compute > COMPUTE_SLICES:
            continue
        # Place at the start that leaves the most room for the rest: the highest free start keeps low, large,
        # aligned blocks (the only places 4g/7g can go) open.
        options = [s for s in p.starts if not (mask & p.mask(s))]
        if not options:
            continue
        start = max(options, key=lambda s: (_headroom(table, mask | p.mask(s)), s))
        mask |= p.mask(start)
        compute += p.compute
        created.append((name, start))
    return created


def _headroom(table: dict[str, MigProfile], mask: int) -> int:
    return sum(sum(1 for s in p.starts if not (mask & p.mask(s))) * p.slots for p in table.values())
