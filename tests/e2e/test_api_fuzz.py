"""Schemathesis against the live gateway's own OpenAPI: every check it has (`--checks all`) over every phase
(examples, coverage, fuzzing, and the stateful phase over the links it infers from the document: submit a job, then
read, explain, cancel it by `job_id`), no server error, and every response (status, content type, headers, body)
as documented.

What the run is told, each from the document itself (`_config`):
- `GET /v1/events` is a stream that stays open for `max_seconds`: the run pins `max_seconds=1` so each generated
  request ends, and its events are checked against the per-event schema (ST108).
- `positive_data_acceptance` (ST202) also accepts 422 only on the operations whose 422 response declares
  `x-refusal-reasons`: rules JSON Schema cannot say (a report window at most 400 days between two parameters, a
  MIG slice needs `gpus: 1` and no gang, a loan ends within 90 days of now, the team must exist). Every other
  operation must accept every schema-valid request.
- `negative_data_rejection` (ST201) also accepts 413: a body that breaks `maxItems` by being huge is refused for
  its size (`MAX_BODY_BYTES`, before any parsing), which is a rejection, and documented on every operation.
- `negative_data_rejection` is off (a 2xx counts as expected) on the operations with a repeatable (array) query
  parameter (the reports' filters, `history/jobs?team=`, `events?type=`), and only there: Schemathesis 4.32
  mutates such a parameter into a scalar (`mig_profile=1.05e-297` instead of `["..."]`), which goes on the wire as
  `?mig_profile=1.05e-297`, exactly a valid one-element array; the server rightly accepts it and the check calls
  that a failure (its wire-equivalence guards cover scalar query parameters and array path parameters, not array
  query parameters). Every other check runs on them; their bad values are tests/e2e/test_reports.py's (422 on a
  bad `group_by`, range or a time without a zone).

No check is excluded by name. One worker: with two threads, Hypothesis' lambda introspection inside Schemathesis'
coverage phase intermittently trips a CPython AST recursion-depth check (a thread-safety bug in the tool, not in
the API)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

# the generated run takes ~4 min on 2 cores; the subprocess may take 10
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(660)]

MIN_REQUESTS = 2000
POSITIVE_DEFAULT = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # schemathesis 4.32's own default
NEGATIVE_DEFAULT = ["400", "401", "403", "404", "405", "406", "409", "415", "422", "428", "429", "5xx"]


def _config(document: dict) -> str:
    """One `[[operations]]` entry per operation that needs one (Schemathesis applies the first entry that matches)."""
    lines = ["[checks.negative_data_rejection]",
             f"expected-statuses = {json.dumps([*NEGATIVE_DEFAULT, '413'])}", ""]
    for item in document["paths"].values():
        for operation in item.values():
            entry: list[str] = []
            if operation["operationId"] == "streamEvents":
                entry.append('parameters = { "query.max_seconds" = 1 }')
            if "x-refusal-reasons" in operation.get("responses", {}).get("422", {}):
                entry += ["[operations.checks.positive_data_acceptance]",
                          f"expected-statuses = {json.dumps([*POSITIVE_DEFAULT, '422'])}"]
            if any(p["in"] == "query" and "array" in json.dumps(p["schema"]) for p in operation.get("parameters", ())):
                # Schemathesis runs one check list for the whole run (`enabled = false` per operation is not
                # honoured); a 2xx counted as expected is the per-operation way to switch the check off
                entry += ["[operations.checks.negative_data_rejection]",
                          f"expected-statuses = {json.dumps([*NEGATIVE_DEFAULT, '413', '2xx'])}"]
            if entry:
                lines += ["[[operations]]", f'include-operation-id = "{operation["operationId"]}"', *entry, ""]
    return "\n".join(lines)


def test_generated_requests_find_no_failure_with_every_check(platform, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    document = httpx.get(f"{platform.gateway}/openapi.json", timeout=10).json()
    declared = [op["operationId"] for item in document["paths"].values() for op in item.values()
                if "x-refusal-reasons" in op.get("responses", {}).get("422", {})]
    assert "submitJob" in declared and "usageReport" in declared, declared
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(document))
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [str(st), "--config-file", str(config), "run", f"{platform.gateway}/openapi.json",
         "-H", f"Authorization: Bearer {platform.run['admin_token']}", "--checks", "all",
         "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "40", "--workers", "1",
         "--request-timeout", "20", "--seed", "20261130", "--no-color"],
        capture_output=True, text=True, timeout=600)
    report = result.stdout + result.stderr
    generated = re.search(r"(\d+) generated", report)
    assert generated is not None, report[-3000:]
    assert int(generated.group(1)) >= MIN_REQUESTS, report[-2000:]
    links = re.search(r"API Links:\s+(\d+) covered", report)
    assert links is not None and int(links.group(1)) > 0, report[-3000:]  # the stateful phase followed links
    assert result.returncode == 0, report[-8000:]
    # Schemathesis' closing line: "No issues found", or only warnings (e.g. every generated id answered 404 on
    # an approve endpoint); failures or errors make the return code non-zero, checked above.
    closing = [line for line in report.splitlines() if line.startswith("=") and " in " in line]
    assert closing and re.search(r"No issues found|^=+ \d+ warnings? in", closing[-1]), closing[-1:]
    assert not re.search(r"\d+ (failures?|errors?)", closing[-1])
