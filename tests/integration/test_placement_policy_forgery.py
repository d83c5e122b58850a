"""A forged quota.set that got past every check (published with the quota service's own rights) held a revision
the quota service never handed out, so no later real change could replace it. Placement's reconciliation with
the quota service's own answer drops every policy row beyond the highest revision quota issued, on a real
PostgreSQL, and keeps the real ones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.events import QuotaSet
from services.placement import store

NOW = datetime(2026, 12, 1, tzinfo=UTC)
pytestmark = pytest.mark.integration


def quota(path: str, guaranteed: float, revision: int) -> QuotaSet:
    return QuotaSet(path=path, gpu_model="*", guaranteed=guaranteed, revision=revision, set_at=NOW)


async def test_rows_beyond_the_owners_last_revision_are_dropped_and_the_owners_answer_wins(placement_db) -> None:  # type: ignore[no-untyped-def]
    async with placement_db.acquire() as conn:
        await store.upsert_quota(conn, quota("default/research", 8, 5))  # real
        await store.upsert_quota(conn, quota("default/inference", 0, 10**12))  # forged: 0 GPUs guaranteed
        await store.upsert_team(conn, "inference", "default", 10**12)
        # the real change that came later cannot replace the forged row (its revision is lower)
        await store.upsert_quota(conn, quota("default/inference", 16, 9))
        assert await conn.fetchval("SELECT guaranteed FROM policy_quotas WHERE path = 'default/inference'") == 0
        async with conn.transaction():
            assert await store.drop_policy_beyond(conn, 9) == 2  # quota has handed out revisions up to 9
            await store.upsert_quota(conn, quota("default/inference", 16, 9))  # its own answer
            await store.upsert_team(conn, "inference", "default", 8)
        rows = {r["path"]: (r["guaranteed"], r["revision"])
                for r in await conn.fetch("SELECT path, guaranteed, revision FROM policy_quotas")}
        assert rows == {"default/research": (8, 5), "default/inference": (16, 9)}
        assert await conn.fetchval("SELECT revision FROM policy_teams WHERE team = 'inference'") == 8
