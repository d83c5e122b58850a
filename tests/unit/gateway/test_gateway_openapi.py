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


def test_every_json_success_response_refers_to_a_named_component() -> None:
    doc = document()
    untyped = [(path, method, status) for path, item in doc["paths"].items() for method, op in item.items()
               for status, resp in op["responses"].items() if status.startswith("2")
               for media, content in resp.get("content", {}).items() if media == "application/json"
               and "$ref" not in content.get("schema", {})]
    assert untyped == []
    jobs = doc["paths"]["/v1/jobs"]
    assert jobs["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobPage"}
    assert doc["components"]["schemas"]["Job"]["properties"]["trace_id"]["anyOf"][1] == {"type": "null"}


def test_the_client_parses_into_the_classes_the_document_is_built_from() -> None:
    from libs.client import Job, Node
    from libs.contracts import api

    assert Job is api.Job and Node is api.Node
    from libs.client import reports
    from libs.contracts import api_reports

    assert reports.UsageReport is api_reports.UsageReport and reports.WasteReport is api_reports.WasteReport
    doc = document()
    assert doc["components"]["schemas"]["Job"]["properties"].keys() == api.Job.model_json_schema(
        mode="serialization")["properties"].keys()


def test_the_probes_need_no_token_and_everything_else_does() -> None:
    doc = document()
    assert doc["paths"]["/healthz"]["get"]["security"] == [] and doc["paths"]["/readyz"]["get"]["security"] == []
    assert doc["paths"]["/v1/jobs"]["get"]["security"] == [{"HTTPBearer": []}]
    assert {t for item in doc["paths"].values() for op in item.values() for t in op.get("tags", [])} >= {
        "jobs", "pool", "ops", "quota", "reports"}
    assert all(op.get("tags") for item in doc["paths"].values() for op in item.values())


def _examples(doc: dict) -> list[tuple[str, dict, object]]:
    """(where, schema, example) for every example of the document: components' `examples`, and media types' and
    parameters' `example` / `examples`."""
    found = [(f"components/{name}[{i}]", {"$ref": f"#/components/schemas/{name}"}, example)
             for name, schema in doc["components"]["schemas"].items()
             for i, example in enumerate(schema.get("examples", []))]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            places = [(f"{method} {path} {s} {m}", c) for s, r in op["responses"].items()
                      for m, c in r.get("content", {}).items()]
            places += [(f"{method} {path} body {m}", c) for m, c in op.get("requestBody", {}).get("content",
                                                                                                {}).items()]
            places += [(f"{method} {path} ?{p['name']}", p) for p in op.get("parameters", [])]
            for where, holder in places:
                if "example" in holder:
                    found.append((where, holder["schema"], holder["example"]))
                for name, ex in holder.get("examples", {}).items() if isinstance(holder.get("examples"),
                                                                                dict) else []:
                    found.append((f"{where} {name}", holder["schema"], ex["value"]))
    return found


def test_every_example_validates_against_its_schema() -> None:
    """Redocly's `no-invalid-schema-examples` found the capacity and waste reports' examples without the
    nullable fields they set to null (FastAPI drops nulls from the document): checked here without npm."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    doc = document()
    registry = Registry().with_resource("urn:gpupool", Resource.opaque(doc))  # the $refs resolve in the document
    examples = _examples(doc)
    assert len(examples) > 20
    invalid = []
    for where, schema, example in examples:
        rooted = json.loads(json.dumps(schema).replace('"#/components', '"urn:gpupool#/components'))
        errors = list(Draft202012Validator(rooted, registry=registry).iter_errors(example))
        invalid += [f"{where}: {e.message}" for e in errors[:1]]
    assert invalid == []


def test_a_method_the_path_lacks_is_405_naming_every_method_it_has() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(create_app(GatewaySettings(environment="dev")))  # no lifespan: nothing is called
    for method, path, allow in [("DELETE", "/v1/jobs", "GET, HEAD, POST"), ("PUT", "/v1/jobs/j1", "GET, HEAD, PATCH"),
                                ("POST", "/healthz", "GET, HEAD"), ("GET", "/v1/nodes/n1/gpus/0/sharing", "PUT")]:
        response = client.request(method, path)
        assert response.status_code == 405 and response.headers["allow"] == allow, (method, path)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["reason"] == "MethodNotAllowed"


def test_the_schema_refuses_a_loan_for_a_whole_org_as_the_server_does() -> None:
    import pytest
    from pydantic import ValidationError

    from libs.contracts.commands import RequestQuotaLoan

    pattern = document()["components"]["schemas"]["LoanBody"]["properties"]["path"]["pattern"]
    assert re.search(pattern, "default/research") and re.search(pattern, "default/research/llm")
    assert not re.search(pattern, "default") and not re.search(pattern, "a/b/c/d")
    with pytest.raises(ValidationError):
        RequestQuotaLoan(path="default", gpu_model="*", gpus=1, until="2030-01-01T00:00:00Z", reason="r",
                         requested_by="admin")


def test_what_the_server_enforces_is_in_the_document_or_declared_as_a_refusal() -> None:
    """Schemathesis' positive_data_acceptance (ST202, issue #20): a schema-valid request must be accepted. What
    JSON Schema can say is in the schema; the rules it cannot (across parameters, against now or what exists) are
    a 422 with `x-refusal-reasons` on exactly the operations that have them."""
    doc = document()
    ops = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
    refusing = {name: op["responses"]["422"]["x-refusal-reasons"] for name, op in ops.items()
                if "x-refusal-reasons" in op["responses"].get("422", {})}
    assert refusing["usageReport"] == ["InvalidRange"] and refusing["historyJobs"] == ["InvalidRange"]
    assert "UnknownTeam" in refusing["submitJob"] and refusing["requestLoan"] == ["InvalidLoan", "UnknownTeam"]
    assert "MIG slice" in ops["submitJob"]["responses"]["422"]["description"]
    assert "listJobs" not in refusing and "getJob" not in refusing
    params = {p["name"]: p["schema"] for p in ops["jobUtilization"]["parameters"]}
    assert params["step_s"]["multipleOf"] == 60  # beside anyOf [integer, null]: null has no multiple
    # the edge refuses NUL anywhere in the URL (400): every free-text parameter says so
    assert params["job_id"]["pattern"] == "^[^\\x00]*$"
    team = [p for p in ops["listJobs"]["parameters"] if p["name"] == "team"][0]["schema"]
    assert all(b.get("pattern") for b in team.get("anyOf", [team]) if b.get("type") == "string")
    # PATCH needs one of replicas, command, env, not null
    scale = doc["components"]["schemas"]["ScaleBody"]
    assert [b["required"] for b in scale["anyOf"]] == [["replicas"], ["command"], ["env"]]
    price = doc["components"]["schemas"]["CostRateBody"]["properties"]["price_per_hour"]["anyOf"][1]["pattern"]
    assert re.search(price, "2.49") and re.search(price, "1000000") and not re.search(price, "")
    assert not re.search(price, "1000001") and not re.search(price, "0.1234567")


def test_each_server_sent_event_is_documented_as_what_it_carries() -> None:
    from jsonschema import Draft202012Validator

    content = document()["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    event = content["schema"]
    Draft202012Validator(event).validate({"id": "e1", "event": "io.gpupool.job.submitted.v1", "data": "{}"})
    inner = Draft202012Validator(event["properties"]["data"]["contentSchema"])
    assert inner.is_valid({"specversion": "1.0", "id": "e1", "source": "/gpupool/queue", "type": "x", "data": {}})
    assert inner.is_valid({"detail": "reader fell behind; reconnect"})
    assert not inner.is_valid({"id": "e1"})


def test_a_whole_number_written_with_a_fraction_is_that_integer() -> None:
    """JSON Schema's `integer` admits 2.0: the strict bodies take it, and still refuse 2.5, "2" and true."""
    import pytest
    from pydantic import ValidationError

    from services.gateway.handlers import JobRequestBody

    body = JobRequestBody.model_validate({"name": "a", "team": "t", "gpus": 116.0, "max_runtime_s": 60})
    assert body.gpus == 116 and isinstance(body.gpus, int) and body.max_runtime_s == 60.0
    for bad in (2.5, "2", True):
        with pytest.raises(ValidationError):
            JobRequestBody.model_validate({"name": "a", "team": "t", "gpus": bad})
