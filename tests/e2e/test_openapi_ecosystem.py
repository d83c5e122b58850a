"""The gateway's OpenAPI document as the ecosystem's tools read it (issue #20, docs/ecosystem.md): openapi-python-client
generates a client from it without one warning, Redocly CLI's `recommended` rules find no error in it, and the
generated client, imported from the package it wrote, submits, lists, explains and cancels a job against the live
gateway with typed models and gets a typed `Problem` on a 404 and a 422."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ecosystem import npm_bin

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
PACKAGE = "gpupool_api_client"


@pytest.fixture(scope="module")
def spec(platform, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The document as the running gateway serves it."""
    path = tmp_path_factory.mktemp("openapi") / "openapi.json"
    with platform.client() as api:
        path.write_text(json.dumps(api.get("/openapi.json").raise_for_status().json()))
    return path


def test_openapi_python_client_generates_without_a_warning_and_the_client_works(platform, spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    venv_bin = Path(sys.executable).parent
    done = subprocess.run(  # its post-hook runs ruff, found on PATH in the project's environment
        [str(venv_bin / "openapi-python-client"), "generate", "--path", str(spec), "--output-path",
         str(tmp_path / "client")], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"})
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-3000:]
    assert "Warning" not in report and "warning" not in report, report[-3000:]
    sys.path.insert(0, str(tmp_path / "client"))
    try:
        _use_generated_client(platform)
    finally:
        sys.path.remove(str(tmp_path / "client"))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _use_generated_client(platform) -> None:  # type: ignore[no-untyped-def]
    client_mod = importlib.import_module(PACKAGE)
    models = importlib.import_module(f"{PACKAGE}.models")
    jobs = {op: importlib.import_module(f"{PACKAGE}.api.jobs.{op}")
            for op in ("submit_job", "list_jobs", "get_job", "explain_job", "cancel_job")}
    with client_mod.AuthenticatedClient(base_url=platform.gateway, token=platform.run["admin_token"]) as client:
        submitted = jobs["submit_job"].sync(client=client, body=models.JobRequestBody(
            name="generated", team="research", gpus=1))
        assert isinstance(submitted, models.SubmitResult), submitted
        assert submitted.team == "research" and submitted.gpus == 1 and submitted.job_id

        page = jobs["list_jobs"].sync(client=client, team="research")
        assert isinstance(page, models.JobPage)
        assert all(isinstance(job, models.Job) for job in page.items)
        assert submitted.job_id in {job.job_id for job in page.items}

        explained = jobs["explain_job"].sync(client=client, job_id=submitted.job_id)
        assert isinstance(explained, models.Explanation) and explained.job_id == submitted.job_id
        assert isinstance(explained.placement, models.PlacementExplanation)

        cancelled = jobs["cancel_job"].sync(client=client, job_id=submitted.job_id,
                                            body=models.CancelBody(reason="generated client"))
        assert isinstance(cancelled, models.Job) and cancelled.state == "cancelled"

        missing = jobs["get_job"].sync_detailed(client=client, job_id="no-such-job")
        assert missing.status_code == 404 and isinstance(missing.parsed, models.Problem)
        assert missing.parsed.reason == "JobNotFound" and missing.parsed.status == 404

        refused = jobs["submit_job"].sync_detailed(client=client, body=models.JobRequestBody(
            name="generated", team="no-such-team", gpus=1))
        assert refused.status_code == 422 and isinstance(refused.parsed, models.Problem)
        assert refused.parsed.reason == "UnknownTeam", refused.parsed


def test_redocly_recommended_rules_find_no_error(spec) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run([npm_bin("redocly"), "lint", "--extends", "recommended", "--format", "json", str(spec)],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout[done.stdout.index("{"):])
    problems = [(p["severity"], p["ruleId"], p["message"]) for p in report["problems"]]
    assert [p for p in problems if p[0] == "error"] == [], problems
    # the only warnings: the two probes (/healthz, /readyz) have no 4XX response, and none is possible
    assert sorted(p[1] for p in problems) == ["operation-4xx-response"] * 2, problems
    assert done.returncode == 0, done.stderr[-2000:]
