"""The typed client and the `gpupool` CLI against the live platform (`gpupool up` processes): a user's walk from
submitting through watching to cancelling a job."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from libs.cli.main import main
from libs.client import GpupoolClient, GpupoolError

pytestmark = pytest.mark.e2e


@pytest.fixture()
def gp(platform):  # type: ignore[no-untyped-def]
    with GpupoolClient(platform.gateway, platform.run["admin_token"]) as client:
        yield client


def wait_for_state(gp: GpupoolClient, job_id: str, state: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gp.get_job(job_id).state == state:
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {state}: {gp.get_job(job_id).state}")


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
    assert code == 0 and sum(r["allocated"] for r in json.loads(out)) >= 1

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
