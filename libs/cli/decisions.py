"""`gpupool decisions list|show|replay`: what the scheduler decided, cycle by cycle, and proof that a recorded
cycle schedules again to the same plan with the same core (platform admins and operators)."""

from __future__ import annotations

import argparse
import base64
import gzip
from collections.abc import Callable
from typing import Any

from libs.cli.render import emit, fmt_time, key_values, raws, table
from libs.client import GpupoolClient

EXIT_OK, EXIT_DIFFERENT = 0, 1


def replay(decision: Any) -> dict[str, Any]:
    """Schedule the recorded input again; compare the plan with what was recorded, decision by decision."""
    from libs.core import (  # the scheduling core: only this command needs it (~0.1 s of start-up)
        codec,
        schedule,
    )

    if not decision.input_gzip_base64:
        raise ValueError("the decision carries no recorded input")
    inputs = codec.loads(gzip.decompress(base64.b64decode(decision.input_gzip_base64)))
    plan = schedule(inputs["snapshot"], inputs["pending"], inputs["policy"], now=inputs["now"])
    digest = codec.plan_digest(plan)
    recorded = codec.decode(decision.plan)
    diffs = []
    for part in ("placements", "pending", "preemptions", "mig_reconfigs", "reservations"):
        now_items, then_items = set(getattr(plan, part)), set(getattr(recorded, part))
        if now_items != then_items:
            diffs.append({"part": part, "only_in_replay": len(now_items - then_items),
                          "only_in_record": len(then_items - now_items)})
    return {"cycle_id": decision.cycle_id, "same": digest == decision.plan_digest and not diffs,
            "recorded_plan_digest": decision.plan_digest, "replayed_plan_digest": digest,
            "placements": len(plan.placements), "pending": len(plan.pending),
            "preemptions": len(plan.preemptions), "differences": diffs}


def cmd_list(args: argparse.Namespace, gp: GpupoolClient) -> int:
    items = gp.list_decisions(limit=args.limit)

    def render() -> str:
        rows = [(d.cycle_id, fmt_time(d.decided_at), d.policy, sum(p.get("applied", False) for p in d.placements),
                 len(d.preemptions), ", ".join(f"{k} {v}" for k, v in sorted(d.pending_by_reason.items())) or "-",
                 d.versions.get("policy_revision", 0)) for d in items]
        return table(("CYCLE", "DECIDED", "POLICY", "PLACED", "PREEMPTED", "PENDING BY REASON", "POLICY REV"), rows)

    emit(args, raws(items), render)
    return EXIT_OK


def cmd_show(args: argparse.Namespace, gp: GpupoolClient) -> int:
    d = gp.get_decision(args.cycle_id)

    def render() -> str:
        head = key_values([("cycle", d.cycle_id), ("decided", d.decided_at), ("policy", d.policy),
                           ("input digest", d.input_digest), ("plan digest", d.plan_digest),
                           ("versions", ", ".join(f"{k}={v}" for k, v in sorted(d.versions.items())))])
        placed = table(("UNIT", "NODE", "GPUS", "SHARE", "APPLIED"),
                       [(p["unit"], p["node"], len(p["gpus"]), p.get("mig_profile") or f"{p['share_milli'] / 1000:g}",
                         "yes" if p["applied"] else "refused") for p in d.placements]) if d.placements else "no placements"
        victims = table(("VICTIM", "FOR", "REASON"), [(v["victim"], v["preemptor"], v["reason"])
                                                      for v in d.preemptions]) if d.preemptions else "no preemptions"
        return "\n\n".join((head, placed, victims))

    raw = {k: v for k, v in d.raw.items() if k not in ("input_gzip_base64", "plan")}
    emit(args, raw, render)
    return EXIT_OK


def cmd_replay(args: argparse.Namespace, gp: GpupoolClient) -> int:
    result = replay(gp.get_decision(args.cycle_id))

    def render() -> str:
        if result["same"]:
            return (f"cycle {result['cycle_id']}: replayed to the same plan ({result['placements']} placement(s), "
                    f"{result['preemptions']} preemption(s), {result['pending']} pending; "
                    f"digest {result['replayed_plan_digest'][:16]})")
        lines = [f"cycle {result['cycle_id']}: the replay DIFFERS from the record "
                 f"({result['recorded_plan_digest'][:16]} → {result['replayed_plan_digest'][:16]})"]
        lines += [f"  {d['part']}: {d['only_in_replay']} only in the replay, {d['only_in_record']} only in the record"
                  for d in result["differences"]]
        return "\n".join(lines)

    emit(args, result, render)
    return EXIT_OK if result["same"] else EXIT_DIFFERENT


def register(sub: argparse._SubParsersAction,
             add: Callable[..., argparse.ArgumentParser]) -> None:
    text = "recorded scheduling cycles: list, show, replay (admins, operators)"
    group = sub.add_parser("decisions", help=text, description=text)
    dsub = group.add_subparsers(dest="decisions_command", required=True, metavar="{list,show,replay}")
    p = add("list", cmd_list, "recorded scheduling cycles, newest first", dsub)
    p.add_argument("--limit", type=int, default=20, help="show at most this many (default 20)")
    p = add("show", cmd_show, "one cycle: its placements, preemptions, digests and input versions", dsub)
    p.add_argument("cycle_id", metavar="CYCLE_ID")
    p = add("replay", cmd_replay, "schedule a recorded cycle's input again with this core and compare the plan "
                                  "(exit 1 when it differs)", dsub)
    p.add_argument("cycle_id", metavar="CYCLE_ID")
