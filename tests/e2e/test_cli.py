"""The typed client and the `gpupool` CLI against the live platform (`gpupool up` processes): a user's walk from
submitting through watching to cancelling a job, and the newer commands (explain, scale, teams/quota, approvals)."""

from __future__ import annotations

import json
import uuid

import pytest
from support import eventually

from libs.cli.main import main
from libs.client import GpupoolClient, GpupoolError

pytestmark = pytest.mark.e2e


@pytest.fixture()
def gp(platform):  # type: ignore[no-untyped-def]
    with GpupoolClient(platform.gateway, platform.run["admin_token"]) as client:
        yield client


def wait_for_state(gp: GpupoolClient, job_id: str, state: str, timeout_s: float = 30) -> None:
    eventually(lambda: gp.get_job(job_id).state == state, f"job {job_id} to reach {state}", timeout_s)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", cli.url, "--token", cli.token])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_submit_watch_and_cancel_through_the_cli(platform, gp, capsys):
    cli.url, cli.token = platform.gateway, platform.run["admin_token"]
    assert gp.ready().ready
    name = f"cli-{uuid.uuid4().hex[:8]}"
    code, out, _ = cli(capsys, "submit", "--name", name, "--team", "research", "--gpus", "1", "-o", "json")
    assert code == 0
    job_id = json.loads(out)["job_id"]
    wait_for_state(gp, job_id, "running")

    code, out, _ = cli(capsys, "describe", job_id)
    assert code == 0 and "AllocationGranted" in out
    code, out, _ = cli(capsys, "top", "--once", "-o", "json")
    assert code == 0 and any(r["job_id"] == job_id for r in json.loads(out))
    code, out, _ = cli(capsys, "pool", "-o", "json")
    assert code == 0 and json.loads(out)["all"]["totals"]["allocated"] >= 1
    code, out, _ = cli(capsys, "pool")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["CLUSTER", "MODEL", "TOTAL"]

    code, out, _ = cli(capsys, "cancel", job_id, "--reason", "integration test")
    assert (code, out) == (0, f"job {job_id} is cancelled\n")
    code, _, err = cli(capsys, "cancel", job_id)
    assert code == 1 and err.startswith("error: JobAlreadyFinished:")


def test_client_errors_and_idempotent_submit(gp):
    with pytest.raises(GpupoolError) as info:
        gp.submit_job("x", "no-such-team", 1)
    assert (info.value.status, info.value.reason) == (422, "UnknownTeam")
    key = f"it-{uuid.uuid4().hex}"
    first = gp.submit_job("idem", "research", 1, idempotency_key=key)
    again = gp.submit_job("idem", "research", 1, idempotency_key=key)
    assert first.created and not again.created and first.job_id == again.job_id
    gp.cancel_job(first.job_id, "integration test")
    assert gp.get_job(first.job_id).state == "cancelled"



def test_explain_scale_quota_and_approvals_through_the_cli(platform, gp, capsys):
    cli.url, cli.token = platform.gateway, platform.run["admin_token"]
    suffix = uuid.uuid4().hex[:6]

    # a replicated job: explain it, scale it 2 → 3, and see three live allocations
    code, out, err = cli(capsys, "submit", "--name", f"chat-{suffix}", "--team", "inference", "--gpus", "1",
                         "--replicas", "2", "--kind", "inference", "--model", "L40S", "-o", "json")
    assert code == 0, err
    service = json.loads(out)
    assert service["replicas"] == 2
    eventually(lambda: len(gp.list_allocations(job_id=service["job_id"], active=True)) == 2, "2 replicas")
    code, out, _ = cli(capsys, "explain", service["job_id"])
    assert code == 0 and "Placement:" in out and "2 running of 2 wanted" in out
    code, out, _ = cli(capsys, "scale", service["job_id"], "--replicas", "3")
    assert code == 0 and out.startswith(f"job {service['job_id']} scaled to 3 replica(s)")
    eventually(lambda: len(gp.list_allocations(job_id=service["job_id"], active=True)) == 3, "3 replicas")
    code, out, _ = cli(capsys, "explain", service["job_id"], "-o", "json")
    placement = json.loads(out)["placement"]
    assert code == 0 and placement["replicas_running"] == 3 and len(placement["allocations"]) == 3
    code, out, _ = cli(capsys, "jobs", "--state", "awaiting_approval")
    assert code == 0

    # a team and a quota entry for it, listed and removed
    team = f"cli-{suffix}"
    code, out, _ = cli(capsys, "teams", "create", team)
    assert code == 0 and out.startswith(f"team {team} (org default)")
    code, out, _ = cli(capsys, "quota", "set", f"default/{team}", "--model", "L40S", "--guaranteed", "2",
                       "--borrowing-limit", "1")
    assert code == 0 and "guaranteed 2 · borrowing limit 1" in out
    code, out, _ = cli(capsys, "quota", "list", "-o", "json")
    mine = [q for q in json.loads(out) if q["path"] == f"default/{team}"]
    assert code == 0 and [(q["gpu_model"], q["guaranteed"], q["borrowing_limit"]) for q in mine] == [("L40S", 2, 1)]
    code, out, _ = cli(capsys, "quota", "delete", f"default/{team}", "--model", "L40S")
    assert code == 0

    # an approval rule holds a 6-GPU job until it is approved through the CLI
    code, out, _ = cli(capsys, "approvals", "rule", "gpus_over", "4")
    assert (code, out) == (0, "rule gpus_over 4 (enabled)\n")
    try:
        code, out, _ = cli(capsys, "submit", "--name", f"big-{suffix}", "--team", "research", "--gpus", "6",
                           "--model", "H100-80GB", "-o", "json")
        big = json.loads(out)
        assert code == 0 and big["state"] == "awaiting_approval" and big["approval_id"]
        code, out, _ = cli(capsys, "approvals", "list", "--state", "pending")
        assert code == 0 and big["approval_id"] in out and "rules: gpus_over 4 (enabled)" in out
        code, out, _ = cli(capsys, "explain", big["job_id"])
        assert code == 0 and "awaiting_approval" in out
        code, out, _ = cli(capsys, "approvals", "approve", big["approval_id"], "--comment", "e2e")
        assert code == 0 and out.startswith(f"approval {big['approval_id']} approved: job {big['job_id']}")
        wait_for_state(gp, big["job_id"], "running")
        code, _, err = cli(capsys, "approvals", "deny", big["approval_id"])
        assert code == 1 and err.startswith("error: AlreadyDecided:")
    finally:
        code, out, _ = cli(capsys, "approvals", "rule", "gpus_over", "--disable")
    assert (code, out) == (0, "rule gpus_over 4 (disabled)\n")
    gp.cancel_job(big["job_id"], "integration test")
    gp.cancel_job(service["job_id"], "integration test")
