"""Scheduling decisions: every placement cycle that decided something, with the versions of what it read and its
whole recorded input, so operators can see why the pool looks as it does and replay a cycle
(`gpupool decisions replay CYCLE_ID`). Inputs show every team's jobs: platform admins and operators only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from libs.contracts import subjects
from libs.contracts.api import Decision
from libs.contracts.api_pages import DecisionPage
from libs.contracts.commands import GetDecision, ListDecisions
from services.gateway.domain import Action
from services.gateway.handlers import ERRORS, Caller, call, require, returns

router = APIRouter(prefix="/v1", responses=ERRORS, tags=["decisions"])


@router.get("/decisions", **returns(DecisionPage), summary="Recorded scheduling cycles, newest first (cursor: `before`)")
async def list_decisions(req: Request, caller: Caller, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                         before: Annotated[str | None, Query(max_length=64)] = None) -> dict:
    """Each item is the cycle's `io.gpupool.decision.cycle.v1` payload: placements (and whether the store
    accepted them), preemptions, pending jobs by reason, input and plan digests, input versions. `next` is the
    cursor for the following (older) page."""
    require(caller, Action.DECISION_READ)
    return await call(req, subjects.QUERY_PLACEMENT_LIST_DECISIONS, ListDecisions(limit=limit, before=before))


@router.get("/decisions/{cycle_id}", **returns(Decision), summary="One recorded cycle with its input (to replay) and plan")
async def get_decision(req: Request, caller: Caller,
                       cycle_id: Annotated[str, Path(min_length=1, max_length=64)]) -> dict:
    """`input_gzip_base64` is the gzip of the core's JSON encoding (libs.core.codec) of the cycle's snapshot,
    pending units, policy and clock; `plan` is the encoded plan it produced."""
    require(caller, Action.DECISION_READ)
    return await call(req, subjects.QUERY_PLACEMENT_GET_DECISION, GetDecision(cycle_id=cycle_id))
