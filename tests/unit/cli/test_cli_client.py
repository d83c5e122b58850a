"""The Python client against a fake gateway (httpx.MockTransport): problems, retries, pagination, configuration."""

from __future__ import annotations

import json

import httpx
import pytest
from cli_fakes import FakeGateway, allocation, approval, job, pool_doc, problem, quota, reclaim_policy

from libs.client import ConfigError, GpupoolClient, GpupoolError, error_from_response, resolve_connection


def client(gw: FakeGateway) -> GpupoolClient:
    return GpupoolClient("http://gw.test/", "tok", transport=gw.transport, sleep=lambda _s: None)


# --- problem parsing --------------------------------------------------------------------------------------------------
def test_problem_json_becomes_a_gpupool_error_with_reason_detail_and_body():
    exc = error_from_response(problem(422, "UnknownTeam", "team 'x' does not exist"))
    assert (exc.status, exc.reason, exc.detail) == (422, "UnknownTeam", "team 'x' does not exist")
    assert exc.problem["type"].endswith("/UnknownTeam")
    assert str(exc) == "UnknownTeam: team 'x' does not exist (HTTP 422)"


def test_a_non_json_error_body_still_gives_a_readable_error():
    exc = error_from_response(httpx.Response(502, text="<html>\n <h1>Bad   gateway</h1></html>"))
    assert (exc.status, exc.reason) == (502, "BadGateway")
    assert exc.detail == "<html> <h1>Bad gateway</h1></html>" and exc.problem == {}
    exc = error_from_response(httpx.Response(500))
    assert (exc.reason, exc.detail) == ("InternalServerError", "Internal Server Error")


def test_json_error_without_reason_falls_back_to_title():
    exc = error_from_response(httpx.Response(409, json={"title": "conflict here"}))
    assert (exc.reason, exc.detail) == ("ConflictHere", "conflict here")


def test_api_error_raised_by_a_call():
    gw = FakeGateway()
    gw.on("GET", "/v1/jobs/nope", problem(404, "JobNotFound", "no job nope"))
    with pytest.raises(GpupoolError) as info:
        client(gw).get_job("nope")
    assert (info.value.status, info.value.reason) == (404, "JobNotFound")
    assert len(gw.calls) == 1  # 404 is an answer, never retried


def test_ids_are_escaped_into_one_path_segment():
    gw = FakeGateway()
    client_ = client(gw)
    with pytest.raises(GpupoolError):
        client_.get_job("../nodes")
    assert gw.calls[0].url.raw_path == b"/v1/jobs/..%2Fnodes"


# --- retries ----------------------------------------------------------------------------------------------------------
def test_get_is_retried_on_503_and_connection_errors_then_succeeds():
    gw, answers = FakeGateway(), iter(["down", "503", "ok"])

    def flaky(req):
        step = next(answers)
        if step == "down":
            raise httpx.ConnectError("refused", request=req)
        if step == "503":
            return problem(503, "ServiceUnavailable", "retry later")
        return {"items": [job()], "next": None}

    gw.on("GET", "/v1/jobs", flaky)
    sleeps: list[float] = []
    gp = GpupoolClient("http://gw.test", "tok", transport=gw.transport, sleep=sleeps.append)
    assert [j.job_id for j in gp.list_jobs()] == ["j1"]
    assert len(gw.calls) == 3 and len(sleeps) == 2


def test_retries_are_bounded_to_three_tries():
    gw = FakeGateway()
    gw.on("GET", "/v1/nodes", problem(503, "ServiceUnavailable", "retry later"))
    with pytest.raises(GpupoolError) as info:
        client(gw).list_nodes()
    assert info.value.status == 503 and len(gw.calls) == 3


def test_non_idempotent_posts_are_not_retried():
    gw = FakeGateway()
    gw.on("POST", "/v1/jobs/j1/cancel", problem(503, "ServiceUnavailable", "retry later"))
    with pytest.raises(GpupoolError):
        client(gw).cancel_job("j1", "because")
    assert len(gw.calls) == 1
    assert json.loads(gw.calls[0].content) == {"reason": "because"}


def test_submit_sends_one_idempotency_key_and_reuses_it_on_retry():
    gw, answers = FakeGateway(), iter([503, 201])

    def submit(req):
        status = next(answers)
        if status == 503:
            return problem(503, "ServiceUnavailable", "retry later")
        return httpx.Response(201, json=job(state="pending") | {"job_id": "j9"})

    gw.on("POST", "/v1/jobs", submit)
    result = client(gw).submit_job("demo", "research", 2, gpu_models=["H100-80GB"], kind="training")
    keys = {c.headers["Idempotency-Key"] for c in gw.calls}
    assert len(gw.calls) == 2 and len(keys) == 1 and keys.pop().startswith("gpupool-client-")
    assert json.loads(gw.calls[0].content) == {"name": "demo", "team": "research", "gpus": 2,
                                               "kind": "training", "gpu_models": ["H100-80GB"]}
    assert result.job_id == "j9" and result.created is True


def queue_full(retry_after: str) -> httpx.Response:
    resp = problem(429, "QueueFull", "12 jobs are waiting for placement and the queue takes at most 10; retry in "
                   f"{retry_after} s")
    resp.headers["Retry-After"] = retry_after
    return resp


def test_a_full_queue_is_waited_out_when_retry_after_is_short_and_reported_when_long():
    gw, answers = FakeGateway(), iter(["full", "ok"])
    gw.on("POST", "/v1/jobs", lambda req: queue_full("3") if next(answers) == "full"
          else httpx.Response(201, json=job(state="pending") | {"job_id": "j9"}))
    sleeps: list[float] = []
    gp = GpupoolClient("http://gw.test", "tok", transport=gw.transport, sleep=sleeps.append)
    assert gp.submit_job("demo", "research", 1).job_id == "j9"
    assert sleeps == [3.0] and len({c.headers["Idempotency-Key"] for c in gw.calls}) == 1

    gw.on("POST", "/v1/jobs", queue_full("60"))  # longer than the client waits by itself: the caller decides
    with pytest.raises(GpupoolError) as info:
        gp.submit_job("demo", "research", 1)
    assert (info.value.status, info.value.reason, info.value.retry_after_s) == (429, "QueueFull", 60.0)
    assert "retry in 60 s" in str(info.value) and sleeps == [3.0]

    gw.on("POST", "/v1/jobs/j1/cancel", queue_full("1"))  # not a call the client repeats
    with pytest.raises(GpupoolError):
        gp.cancel_job("j1")
    assert sleeps == [3.0]


def test_submit_replay_is_reported_as_not_created():
    gw = FakeGateway()
    gw.on("POST", "/v1/jobs", httpx.Response(200, json=job()))
    result = client(gw).submit_job("demo", "research", 2, idempotency_key="k1")
    assert result.created is False and result.idempotency_key == "k1"
    assert gw.calls[0].headers["Idempotency-Key"] == "k1"


def test_unreachable_gateway_is_status_zero():
    def down(req):
        raise httpx.ConnectError("refused", request=req)

    gp = GpupoolClient("http://gw.test", "tok", transport=httpx.MockTransport(down), sleep=lambda _s: None)
    with pytest.raises(GpupoolError) as info:
        gp.list_teams()
    assert info.value.status == 0 and info.value.reason == "Unreachable" and info.value.unreachable
    assert "cannot reach gateway at http://gw.test" in info.value.detail
    assert str(info.value).startswith("Unreachable: cannot reach gateway")


# --- pagination and models ----------------------------------------------------------------------------------------------
def test_list_walks_every_page_via_the_cursor_and_honours_limit():
    gw = FakeGateway()
    pages = {None: ({"items": [job("a"), job("b")], "next": "b"}), "b": {"items": [job("c")], "next": None}}
    gw.on("GET", "/v1/jobs", lambda req: pages[req.url.params.get("cursor")])
    assert [j.job_id for j in client(gw).list_jobs(team="research")] == ["a", "b", "c"]
    assert all(c.url.params["team"] == "research" for c in gw.calls)
    gw.calls.clear()
    assert [j.job_id for j in client(gw).list_jobs(limit=1)] == ["a"]
    assert gw.calls[0].url.params["limit"] == "1" and len(gw.calls) == 1


def test_models_keep_unknown_fields_and_the_raw_json():
    gw = FakeGateway()
    doc = job(history=[{"at": "2025-01-01T12:00:00+00:00", "from": None, "to": "pending", "reason": "Submitted"}],
              new_field={"x": 1})
    gw.on("GET", "/v1/jobs/j1", doc)
    got = client(gw).get_job("j1")
    assert got.history[0].to_state == "pending" and got.history[0].from_state is None
    assert got.new_field == {"x": 1}  # type: ignore[attr-defined]
    assert got.raw == doc


def test_allocation_filters_and_active_flag():
    gw = FakeGateway()
    gw.on("GET", "/v1/allocations", {"items": [allocation("a1", "j1", ["u1"])], "next": None})
    allocs = client(gw).list_allocations(job_id="j1", active=True)
    assert allocs[0].active and allocs[0].gpus[0].uuid == "u1"
    assert gw.calls[0].url.params["active"] == "true" and gw.calls[0].url.params["job_id"] == "j1"


def test_tokens_and_audit():
    gw = FakeGateway()
    created = {"token_id": "t1", "name": "ci", "role": "service", "team": None, "expires_at": None, "token": "s3cr3t"}
    gw.on("POST", "/v1/tokens", lambda req: httpx.Response(201, json=created))
    gw.on("GET", "/v1/tokens", [{k: v for k, v in created.items() if k != "token"}])  # a bare list is fine too
    gw.on("DELETE", "/v1/tokens/t1", httpx.Response(204))
    gw.on("GET", "/v1/audit", {"items": [{"id": 1, "at": "2025-01-01T12:00:00Z", "actor": "admin",
                                          "action": "token.create", "target": "t1", "before": None,
                                          "after": {"role": "service"}}], "next": None})
    gp = client(gw)
    assert gp.create_token("ci", "service").token == "s3cr3t"
    assert json.loads(gw.calls[0].content) == {"name": "ci", "role": "service"}
    assert [t.token_id for t in gp.list_tokens()] == ["t1"]
    assert gp.revoke_token("t1") is None
    assert gp.audit(limit=10, action="token.create")[0].after == {"role": "service"}
    assert gw.calls[-1].url.params["action"] == "token.create" and gw.calls[-1].url.params["limit"] == "10"


def test_ready_treats_503_as_not_ready_without_retrying():
    gw = FakeGateway()
    gw.on("GET", "/readyz", httpx.Response(503, json={"status": "not ready", "services": {"queue": False}}))
    r = client(gw).ready()
    assert not r.ready and r.services == {"queue": False} and len(gw.calls) == 1


def test_sends_the_bearer_token():
    gw = FakeGateway()
    gw.on("GET", "/v1/teams", {"items": [], "next": None})
    client(gw).list_teams()
    assert gw.calls[0].headers["Authorization"] == "Bearer tok"


# --- configuration -----------------------------------------------------------------------------------------------------
def test_from_env_prefers_flags_then_env_then_run_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPOOL_URL", raising=False)
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    monkeypatch.delenv("GPUPOOL_DATA_DIR", raising=False)
    with pytest.raises(ConfigError, match="no gateway URL"):
        resolve_connection()
    (tmp_path / ".gpupool").mkdir()
    (tmp_path / ".gpupool" / "run.json").write_text(json.dumps({"gateway_url": "http://run:1/", "admin_token": "rt"}))
    assert resolve_connection() == ("http://run:1", "rt")
    monkeypatch.setenv("GPUPOOL_URL", "http://env:2")
    monkeypatch.setenv("GPUPOOL_TOKEN", "et")
    assert resolve_connection() == ("http://env:2", "et")
    assert resolve_connection("http://flag:3", "ft") == ("http://flag:3", "ft")
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"gateway_url": "http://dd:4", "admin_token": "dt"}))
    monkeypatch.delenv("GPUPOOL_URL")
    monkeypatch.delenv("GPUPOOL_TOKEN")
    monkeypatch.setenv("GPUPOOL_DATA_DIR", str(other))
    assert resolve_connection() == ("http://dd:4", "dt")
    gp = GpupoolClient.from_env()
    assert gp.base_url == "http://dd:4"
    gp.close()


def test_missing_token_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPOOL_TOKEN", raising=False)
    monkeypatch.delenv("GPUPOOL_DATA_DIR", raising=False)
    monkeypatch.setenv("GPUPOOL_URL", "http://env:2")
    with pytest.raises(ConfigError, match="no API token"):
        resolve_connection()


# --- jobs: shapes, explain, scale ---------------------------------------------------------------------------------------
def test_submit_sends_gang_replica_and_runtime_fields_only_when_given():
    gw = FakeGateway()
    gw.on("POST", "/v1/jobs", lambda req: httpx.Response(201, json=job("j2", **json.loads(req.content))))
    gp = client(gw)
    gp.submit_job("pretrain", "research", 16, gang_nodes=2, gpus_per_node=8, max_runtime_s=7200)
    assert json.loads(gw.calls[0].content) == {"name": "pretrain", "team": "research", "gpus": 16, "gang_nodes": 2,
                                               "gpus_per_node": 8, "max_runtime_s": 7200}
    got = gp.submit_job("chat", "inference", 1, replicas=3)
    assert json.loads(gw.calls[1].content) == {"name": "chat", "team": "inference", "gpus": 1, "replicas": 3}
    assert got.replicas == 3 and got.total_gpus == 3 and got.attempts == 0


def test_submit_awaiting_approval_carries_the_approval_id():
    gw = FakeGateway()
    gw.on("POST", "/v1/jobs", httpx.Response(201, json=job(
        "j3", state="awaiting_approval", approval_id="ap1", approval_reasons=["more than 4 GPUs"])))
    got = client(gw).submit_job("big", "research", 6)
    assert (got.state, got.approval_id, got.approval_reasons) == ("awaiting_approval", "ap1", ["more than 4 GPUs"])


def test_explain_parses_placement_view():
    gw = FakeGateway()
    gw.on("GET", "/v1/jobs/j1/explain", {"job_id": "j1", "state": "pending", "message": "waiting for placement",
                                         "placement": {"job_id": "j1", "state": "pending", "reason": "NoCapacity",
                                                       "message": "no node has 8 free H100-80GB", "position": 2,
                                                       "priority": 100, "priority_class": "normal",
                                                       "replicas_wanted": 1, "replicas_running": 0,
                                                       "allocations": [], "preempting_for_it": ["j0"]}})
    ex = client(gw).explain_job("j1")
    assert (ex.state, ex.placement.reason, ex.placement.position) == ("pending", "NoCapacity", 2)
    assert ex.placement.preempting_for_it == ["j0"] and ex.raw["placement"]["priority"] == 100


def test_scale_patches_replicas_and_is_retried_on_503():
    gw, answers = FakeGateway(), iter([503, 200])

    def scale(req):
        if next(answers) == 503:
            return problem(503, "ServiceUnavailable", "retry later")
        return job("j1", **json.loads(req.content))

    gw.on("PATCH", "/v1/jobs/j1", scale)
    assert client(gw).scale_job("j1", 3).replicas == 3
    assert [json.loads(c.content) for c in gw.calls] == [{"replicas": 3}, {"replicas": 3}]


def test_pool_reads_the_gateway_view():
    gw = FakeGateway()
    gw.on("GET", "/v1/pool", pool_doc())
    pool = client(gw).pool(cluster="sim")
    assert gw.calls[0].url.params["cluster"] == "sim"
    assert pool.clusters[0].models[0].in_use == 3 and pool.all.totals.total == 18


# --- teams, quotas, priority classes --------------------------------------------------------------------------------------
def test_create_team_and_quotas():
    gw = FakeGateway()
    gw.on("POST", "/v1/teams", lambda req: httpx.Response(201, json={"org": "default", **json.loads(req.content),
                                                                      "revision": 1}))
    gw.on("GET", "/v1/quotas", {"items": [quota()], "next": None})
    gw.on("PUT", "/v1/quotas", lambda req: quota(**json.loads(req.content)))
    gw.on("DELETE", "/v1/quotas", httpx.Response(204))
    gp = client(gw)
    assert gp.create_team("vision").org == "default"
    assert json.loads(gw.calls[0].content) == {"team": "vision"}
    assert gp.create_team("vision", org="research").org == "research"
    entries = gp.list_quotas()
    assert entries[0].guaranteed == 8 and entries[0].lending_limit is None
    got = gp.set_quota("default/research", "H100-80GB", guaranteed=2.5, borrowing_limit=None)
    assert json.loads(gw.calls[-1].content) == {"path": "default/research", "gpu_model": "H100-80GB",
                                                "guaranteed": 2.5, "borrowing_limit": None, "lending_limit": None,
                                                "weight": 1.0}
    assert got.guaranteed == 2.5 and got.borrowing_limit is None
    assert gp.delete_quota("default/research") is None
    assert dict(gw.calls[-1].url.params) == {"path": "default/research", "gpu_model": "*"}


def test_delete_and_team_creation_are_not_retried():
    gw = FakeGateway()
    gw.on("DELETE", "/v1/quotas", problem(503, "ServiceUnavailable", "retry later"))
    gw.on("POST", "/v1/teams", problem(503, "ServiceUnavailable", "retry later"))
    with pytest.raises(GpupoolError):
        client(gw).delete_quota("default/research")
    with pytest.raises(GpupoolError):
        client(gw).create_team("vision")
    assert len(gw.calls) == 2


def test_priority_classes():
    gw = FakeGateway()
    gw.on("GET", "/v1/priority-classes", {"items": [{"name": "high", "value": 1000, "preemptible": False,
                                                     "min_runtime_s": None, "description": "", "revision": 1,
                                                     "updated_at": "2025-01-01T12:00:00+00:00"}], "next": None})
    gw.on("PUT", "/v1/priority-classes/nightly", lambda req: {"name": "nightly", **json.loads(req.content)})
    gp = client(gw)
    assert [(c.name, c.value, c.preemptible) for c in gp.list_priority_classes()] == [("high", 1000, False)]
    pc = gp.set_priority_class("nightly", 50, True, min_runtime_s=300, description="evals")
    assert json.loads(gw.calls[-1].content) == {"value": 50, "preemptible": True, "min_runtime_s": 300,
                                                "description": "evals"}
    assert pc.min_runtime_s == 300


# --- approvals and reclaim policies ----------------------------------------------------------------------------------------
def test_approvals_list_rules_and_decisions():
    gw = FakeGateway()
    gw.on("GET", "/v1/approvals", {"items": [approval()], "next": None,
                                   "rules": [{"rule": "gpus_over", "value": "4", "enabled": True}]})
    gw.on("POST", "/v1/approvals/ap1/approve", lambda req: approval(state="approved", decided_by="admin",
                                                                   **json.loads(req.content)))
    gw.on("POST", "/v1/approvals/ap1/deny", problem(409, "AlreadyDecided", "approval ap1 was already approved"))
    gw.on("PUT", "/v1/approval-rules/gpus_over", lambda req: {"rule": "gpus_over", **json.loads(req.content)})
    gp = client(gw)
    items = gp.list_approvals(team="research", state="pending")
    assert items[0].reasons == ["more than 4 GPUs"]
    assert gw.calls[0].url.params["team"] == "research" and gw.calls[0].url.params["state"] == "pending"
    assert [(r.rule, r.value, r.enabled) for r in gp.approval_rules()] == [("gpus_over", "4", True)]
    decided = gp.approve("ap1", "ok for this sprint")
    assert decided.state == "approved" and json.loads(gw.calls[-1].content) == {"comment": "ok for this sprint"}
    with pytest.raises(GpupoolError) as info:
        gp.deny("ap1")
    assert info.value.reason == "AlreadyDecided" and len([c for c in gw.calls if c.method == "POST"]) == 2
    rule = gp.set_approval_rule("gpus_over", 8, enabled=False)
    assert json.loads(gw.calls[-1].content) == {"value": "8", "enabled": False} and rule.enabled is False


def test_reclaim_policies():
    gw = FakeGateway()
    gw.on("GET", "/v1/reclaim-policies", {"items": [reclaim_policy(), reclaim_policy("training", idle_after_s=None)],
                                          "next": None})
    gw.on("PUT", "/v1/reclaim-policies/dev", lambda req: reclaim_policy(**json.loads(req.content)))
    gp = client(gw)
    assert [(p.kind, p.idle_after_s) for p in gp.list_reclaim_policies()] == [("dev", 1800), ("training", None)]
    got = gp.set_reclaim_policy("dev", idle_after_s=600, grace_s=60)
    assert json.loads(gw.calls[-1].content) == {"idle_after_s": 600, "idle_util_pct": 5.0, "grace_s": 60,
                                                "enforce_max_runtime": True}
    assert got.grace_s == 60
