"""The OpenAPI document as client generators read it (issue #20): readable, unique operationIds (`submitJob`, not
`submit_job_v1_jobs_post`), one `Problem` component every error response refers to (inlined, it became a duplicate
model per operation and status), a license and a server."""

from __future__ import annotations

import json
import re
from collections import Counter

from services.gateway.bootstrap import create_app
from services.gateway.config import GatewaySettings


def document() -> dict:
    return create_app(GatewaySettings(environment="dev")).openapi()


def test_every_operation_has_a_unique_camel_case_id() -> None:
    doc = document()
    ids = Counter(op["operationId"] for item in doc["paths"].values() for op in item.values())
    assert len(ids) > 40 and max(ids.values()) == 1
    assert [i for i in ids if not re.fullmatch(r"[a-z][A-Za-z0-9]*", i)] == []
    assert doc["paths"]["/v1/jobs"]["post"]["operationId"] == "submitJob"
    assert doc["paths"]["/v1/jobs"]["get"]["operationId"] == "listJobs"


def test_every_error_response_refers_to_the_one_problem_component() -> None:
    doc = document()
    problem = doc["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail", "reason"} <= set(problem["required"])
    errors = [resp for path, item in doc["paths"].items() if path.startswith("/v1/") for op in item.values()
              for status, resp in op["responses"].items() if status[0] in "45"]  # /readyz's 503 names services
    assert len(errors) > 200
    schemas = [r["content"]["application/problem+json"]["schema"] for r in errors
               if "application/problem+json" in r.get("content", {})]
    assert len(schemas) == len(errors) and all(s == {"$ref": "#/components/schemas/Problem"} for s in schemas)
    assert json.dumps(doc).count("CamelCase machine reason") == 1  # the component, not a copy per response


def test_the_document_names_its_license_and_server() -> None:
    doc = document()
    assert doc["info"]["license"]["identifier"] == "Apache-2.0" and doc["servers"][0]["url"] == "/"
