"""What `gpupool check` finds: violations of named invariants, and the counts that say what was looked at."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Every invariant the checker knows, in the order it reports them, with the sentence it stands for.
CHECKS: dict[str, str] = {
    "gpu_exclusive": "no GPU, MIG slot or fraction is held beyond its capacity by live allocations",
    "job_state": "every job is in exactly one state, the end of the chain of its state_changed events",
    "job_placement": "queue's job states agree with placement's allocations and wanted jobs",
    "allocation_events": "every allocation has exactly its granted (and, once released, released) event",
    "quota_use": "per team and model, GPUs in use equal the sum of live allocations, and placement reports that",
    "ledger": "accounting's ledger equals the allocation intervals it has been told of",
    "outbox": "no event waits in an outbox beyond its bound",
    "event_delivery": "every published outbox row is in its stream, and no service event lacks its outbox row",
    "consumer_lag": "no durable consumer leaves a message unprocessed beyond its bound",
    "dead_letters": "no genuine event (one a service emitted) was dead-lettered",
    "event_origins": "every event in the streams comes from the service that owns its type",
    "job_liveness": "every job wanted beyond its bound is known to placement and was considered by a cycle",
    "scheduler_progress": "placement has decided since every job it has wanted beyond its bound was submitted",
    "telemetry_liveness": "every node inventory holds as ready has a GPU sample younger than its bound",
}


@dataclass(frozen=True)
class Violation:
    check: str  # a key of CHECKS
    kind: str  # what exactly broke, e.g. "gpu_double_held"
    subject: str  # the entity: a GPU uuid, job id, allocation id, consumer, service ...
    detail: str  # one precise sentence a person can act on
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"[{self.check}/{self.kind}] {self.subject}: {self.detail}"


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)  # check → entities examined
    skipped: dict[str, str] = field(default_factory=dict)  # check → why it did not run
    info: dict[str, Any] = field(default_factory=dict)  # dead letters by cause, consumer lag, quota use ...
    errors: list[str] = field(default_factory=list)  # a source could not be read at all

    @property
    def ok(self) -> bool:
        return not self.violations and not self.errors

    def by_check(self) -> dict[str, list[Violation]]:
        out: dict[str, list[Violation]] = {name: [] for name in CHECKS}
        for v in self.violations:
            out.setdefault(v.check, []).append(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        grouped = self.by_check()
        return {
            "ok": self.ok,
            "checks": {name: {"description": CHECKS.get(name, ""), "checked": self.checked.get(name, 0),
                              "skipped": self.skipped.get(name), "violations": len(grouped.get(name, []))}
                       for name in CHECKS},
            "violations": [asdict(v) for v in self.violations],
            "errors": self.errors,
            "info": self.info,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str)

    def to_text(self, max_per_check: int = 20) -> str:
        lines: list[str] = []
        grouped = self.by_check()
        for name, description in CHECKS.items():
            found = grouped.get(name, [])
            if name in self.skipped:
                status = f"SKIP  ({self.skipped[name]})"
            else:
                status = "ok   " if not found else f"FAIL  {len(found)} violation(s)"
            lines.append(f"{name:<18} {status:<28} {self.checked.get(name, 0):>7} checked  — {description}")
            for v in found[:max_per_check]:
                lines.append(f"    {v.kind}: {v.subject}: {v.detail}")
            if len(found) > max_per_check:
                lines.append(f"    … {len(found) - max_per_check} more (use --json for all)")
        for err in self.errors:
            lines.append(f"ERROR {err}")
        dead = self.info.get("dead_letters", {})
        if dead:
            lines.append("dead letters (consumer / reason: count): " + ", ".join(
                f"{k}: {n}" for k, n in sorted(dead.items())))
        lines.append("OK: every invariant holds" if self.ok else
                     f"VIOLATED: {len(self.violations)} violation(s), {len(self.errors)} error(s)")
        return "\n".join(lines)
