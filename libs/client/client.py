"""A small synchronous client of the gpupool HTTP API (httpx), for internal tools and for the `gpupool` CLI.

    from libs.client import GpupoolClient, GpupoolError

    with GpupoolClient.from_env() as gp:
        job = gp.submit_job(name="llama-ft", team="research", gpus=2, gpu_models=["H100-80GB"])
        for j in gp.list_jobs(team="research", state="running"):
            print(j.job_id, j.node)

Every failure is a `GpupoolError(status, reason, detail, problem)`: the gateway's RFC 9457 problem body parsed, or
status 0 / reason "Unreachable" when the gateway cannot be reached at all. Calls that are safe to repeat (every GET;
POST /v1/jobs, which always carries an Idempotency-Key; and the PUT/PATCH calls that set an absolute value: scale,
quota, priority class, approval rule, reclaim policy; cordon, drain, uncordon, GPU sharing) are retried on 503 and on
connection errors, at most 3 tries with a short back-off, and on a 429 whose `Retry-After` is at most
`max_retry_after_s` (10 s unless given) after waiting that long (a full queue: `QueueFull`); nothing else (cancel, complete, approve/deny, a GPU health
clear or quarantine, deletes, team and token creation) is retried.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from libs.client.errors import ConfigError, GpupoolError, _seg, error_from_response, retry_after
from libs.client.models import (
    Allocation,
    ApiModel,
    Approval,
    ApprovalRule,
    AuditEntry,
    CreatedToken,
    Decision,
    Explanation,
    GpuChange,
    Job,
    Node,
    Orphan,
    Pool,
    PoolFragmentation,
    PriorityClass,
    QuotaEntry,
    Readiness,
    ReclaimPolicy,
    SubmitResult,
    Team,
    Token,
    UsageRecord,
    WhoAmI,
)
from libs.client.reports import ReportsApi
from libs.client.work import WorkApi

M = TypeVar("M", bound=ApiModel)

DEFAULT_TIMEOUT_S = 10.0
MAX_TRIES = 3
BACKOFF_S = (0.2, 0.6)  # sleeps between the tries
PAGE_SIZE = 500  # per request when walking a list; the gateway allows up to 1000


def _find_run_file() -> Path | None:
    candidates = []
    if os.environ.get("GPUPOOL_DATA_DIR"):
        candidates.append(Path(os.environ["GPUPOOL_DATA_DIR"]) / "run.json")
    candidates.append(Path.cwd() / ".gpupool" / "run.json")
    return next((p for p in candidates if p.is_file()), None)


def resolve_connection(url: str | None = None, token: str | None = None) -> tuple[str, str]:
    """Where the gateway is and which token to send: explicit values, then GPUPOOL_URL / GPUPOOL_TOKEN, then the
    run.json that `gpupool up` writes ($GPUPOOL_DATA_DIR/run.json, else ./.gpupool/run.json)."""
    url = url or os.environ.get("GPUPOOL_URL") or None
    token = token or os.environ.get("GPUPOOL_TOKEN") or None
    run_file = None
    if not url or not token:
        run_file = _find_run_file()
        if run_file is not None:
            try:
                doc = json.loads(run_file.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"cannot read {run_file}: {exc}") from None
            url = url or doc.get("gateway_url")
            token = token or doc.get("admin_token")
    if not url:
        raise ConfigError("no gateway URL: pass --url, set GPUPOOL_URL, or start one with `gpupool up`")
    if not token:
        raise ConfigError("no API token: pass --token or set GPUPOOL_TOKEN"
                          + (f" ({run_file} has no admin_token)" if run_file else ""))
    return url.rstrip("/"), token


class GpupoolClient(ReportsApi, WorkApi):
    def __init__(self, base_url: str, token: str, timeout: float = DEFAULT_TIMEOUT_S, *,
                 transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep, max_retry_after_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._sleep = sleep
        self.max_retry_after_s = max_retry_after_s
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport,
                                  headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                           "User-Agent": "gpupool-client/0.1"})

    @classmethod
    def from_env(cls, url: str | None = None, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 **kwargs: Any) -> GpupoolClient:
        base_url, tok = resolve_connection(url, token)
        return cls(base_url, tok, timeout, **kwargs)

    # --- plumbing ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GpupoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, json_body: Any = None,
                headers: dict[str, str] | None = None, retry: bool | None = None,
                ok_statuses: Sequence[int] = ()) -> httpx.Response:
        """One API call; raises GpupoolError for anything but 2xx (or a status in `ok_statuses`). `retry`
        defaults to True for GET only."""
        params = {k: v for k, v in (params or {}).items() if v is not None}
        tries = MAX_TRIES if (retry if retry is not None else method.upper() == "GET") else 1
        for attempt in range(1, tries + 1):
            try:
                resp = self._http.request(method, path, params=params or None, json=json_body, headers=headers)
            except httpx.TransportError as exc:
                if attempt < tries:
                    self._sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
                    continue
                kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "cannot reach gateway"
                raise GpupoolError(0, "Unreachable", f"{kind} at {self.base_url} ({type(exc).__name__})") from None
            if resp.status_code == 503 and attempt < tries and 503 not in ok_statuses:
                self._sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
                continue
            wait = retry_after(resp) if resp.status_code == 429 and attempt < tries else None
            if wait is not None and wait <= self.max_retry_after_s:
                self._sleep(wait)  # the gateway said when there will be room: a short wait is worth it
                continue
            if resp.is_success or resp.status_code in ok_statuses:
                return resp
            raise error_from_response(resp)
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.request(method, path, **kwargs)
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise GpupoolError(resp.status_code, "InvalidResponse",
                               f"the gateway answered {method} {path} with a body that is not JSON") from None

    def iter_pages(self, path: str, params: dict[str, Any] | None = None,
                   limit: int | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a `{"items": [...], "next": cursor}` list, following the cursor; at most `limit` items.
        A bare JSON array is accepted too."""
        params = dict(params or {})
        remaining = limit
        cursor: str | None = None
        while True:
            page_size = PAGE_SIZE if remaining is None else max(1, min(PAGE_SIZE, remaining))
            doc = self._json("GET", path, params={**params, "limit": page_size, "cursor": cursor})
            items = doc if isinstance(doc, list) else (doc or {}).get("items", [])
            for item in items:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                yield item
            cursor = None if isinstance(doc, list) else (doc or {}).get("next")
            if not cursor or not items or (remaining is not None and remaining <= 0):
                return

    def _list(self, model: type[M], path: str, params: dict[str, Any] | None = None,
              limit: int | None = None) -> list[M]:
        return [_parse(model, item, path) for item in self.iter_pages(path, params, limit)]

    # --- jobs --------------------------------------------------------------------------------------------------
    def submit_job(self, name: str, team: str, gpus: int, *, project: str | None = None,
                   gpu_models: Sequence[str] | None = None, kind: str | None = None,
                   priority_class: str | None = None, idempotency_key: str | None = None,
                   gang_nodes: int | None = None, gpus_per_node: int | None = None, replicas: int | None = None,
                   max_runtime_s: float | None = None, gpu_fraction_milli: int | None = None,
                   gpu_memory_mib: int | None = None, mig_profile: str | None = None,
                   exclusive: bool | None = None, work: Mapping[str, Any] | None = None,
                   min_replicas: int | None = None, max_replicas: int | None = None,
                   autoscale: Mapping[str, Any] | None = None, cpu_milli: int | None = None,
                   memory_mib: int | None = None, node_selector: Mapping[str, str] | None = None,
                   preemptible: bool | None = None) -> SubmitResult:
        """Submit a job: `gpus` on one node; a gang (`gang_nodes` × `gpus_per_node`, with `gpus` their product)
        placed all or nothing; or `replicas` independent copies of `gpus` each (scale them with `scale_job`).
        `max_runtime_s` declares a limit that lets smaller jobs backfill around reservations. A share of one GPU:
        `gpu_fraction_milli` (1..999) with `gpu_memory_mib` on a fractional GPU, or a MIG slice `mig_profile`;
        `exclusive` keeps a dev job on a whole GPU (dev jobs otherwise default to a share where one is offered).
        `cpu_milli` / `memory_mib`: host CPU (milli-cores) and memory (MiB) reserved on each node it holds;
        `node_selector`: labels its nodes must carry; `preemptible`: its own word on preemption (None: its class).

        Without an idempotency key one is generated, so the client's own retries never create a second job; pass
        your own key to make retries across processes safe too. `created` on the result is False when the gateway
        replayed an earlier submission with the same key and body. A job held back by an approval rule comes back
        in state `awaiting_approval` with `approval_id` and `approval_reasons`. `work`: the work fields of the body
        as they are sent (`submit` builds them from typed arguments)."""
        body: dict[str, Any] = {"name": name, "team": team, "gpus": gpus, **(work or {})}
        for key, value in (("project", project), ("kind", kind), ("priority_class", priority_class),
                           ("gang_nodes", gang_nodes), ("gpus_per_node", gpus_per_node), ("replicas", replicas),
                           ("max_runtime_s", max_runtime_s), ("gpu_fraction_milli", gpu_fraction_milli),
                           ("gpu_memory_mib", gpu_memory_mib), ("mig_profile", mig_profile),
                           ("exclusive", exclusive), ("min_replicas", min_replicas),
                           ("max_replicas", max_replicas), ("autoscale", dict(autoscale) if autoscale else None),
                           ("cpu_milli", cpu_milli), ("memory_mib", memory_mib), ("preemptible", preemptible),
                           ("node_selector", dict(node_selector) if node_selector else None)):
            if value is not None:
                body[key] = value
        if gpu_models:
            body["gpu_models"] = list(gpu_models)
        key = idempotency_key or f"gpupool-client-{uuid.uuid4()}"
        resp = self.request("POST", "/v1/jobs", json_body=body, headers={"Idempotency-Key": key}, retry=True)
        data = resp.json()
        result = _parse(SubmitResult, data, "/v1/jobs")
        result.created = resp.status_code == 201
        result.idempotency_key = key
        return result

    def list_jobs(self, team: str | None = None, state: str | None = None, limit: int | None = None) -> list[Job]:
        return self._list(Job, "/v1/jobs", {"team": team, "state": state}, limit)

    def get_job(self, job_id: str) -> Job:
        return _parse(Job, self._json("GET", f"/v1/jobs/{_seg(job_id)}"), "/v1/jobs/{id}")

    def cancel_job(self, job_id: str, reason: str | None = None) -> Job:
        body = {"reason": reason} if reason else None
        return _parse(Job, self._json("POST", f"/v1/jobs/{_seg(job_id)}/cancel", json_body=body),
                      "/v1/jobs/{id}/cancel")

    def complete_job(self, job_id: str) -> Job:
        return _parse(Job, self._json("POST", f"/v1/jobs/{_seg(job_id)}/complete"), "/v1/jobs/{id}/complete")

    def explain_job(self, job_id: str) -> Explanation:
        """Why a job is where it is: the queue's state and message, and placement's reason code, message,
        position among pending jobs and any preemption for it or against it."""
        return _parse(Explanation, self._json("GET", f"/v1/jobs/{_seg(job_id)}/explain"), "/v1/jobs/{id}/explain")

    def scale_job(self, job_id: str, replicas: int) -> Job:
        """Set how many replicas a replicated job should run; placement adds or releases allocations to match."""
        return _parse(Job, self._json("PATCH", f"/v1/jobs/{_seg(job_id)}", json_body={"replicas": replicas},
                                      retry=True), "/v1/jobs/{id}")

    def update_work(self, job_id: str, command: Sequence[str] | None = None,
                    env: Mapping[str, str] | None = None) -> Job:
        """Roll a service's new command and/or env out replica by replica (`env` replaces the whole environment)."""
        body: dict[str, Any] = {}
        if command is not None:
            body["command"] = list(command)
        if env is not None:
            body["env"] = dict(env)
        return _parse(Job, self._json("PATCH", f"/v1/jobs/{_seg(job_id)}", json_body=body, retry=True),
                      "/v1/jobs/{id}")

    def list_endpoints(self, job_id: str) -> list[dict[str, Any]]:
        """Every live replica of a job: `replica`, `node`, `url`, `ports`, `ready`, `since`, `reason`."""
        return list(self._json("GET", f"/v1/jobs/{_seg(job_id)}/endpoints")["items"])

    def report_load(self, job_id: str, value: float, reporter: str = "") -> dict[str, Any]:
        """A service's load now, for its autoscaler (each reporter's latest value counts; their sum is the load)."""
        return dict(self._json("POST", f"/v1/jobs/{_seg(job_id)}/load",
                               json_body={"value": value, "reporter": reporter}))

    # --- pool --------------------------------------------------------------------------------------------------
    def list_nodes(self, cluster: str | None = None) -> list[Node]:
        return self._list(Node, "/v1/nodes", {"cluster": cluster})

    def list_allocations(self, job_id: str | None = None, active: bool | None = None) -> list[Allocation]:
        params = {"job_id": job_id, "active": None if active is None else str(active).lower()}
        return self._list(Allocation, "/v1/allocations", params)

    def list_usage(self, team: str | None = None, job_id: str | None = None) -> list[UsageRecord]:
        return self._list(UsageRecord, "/v1/usage", {"team": team, "job_id": job_id})

    def get_node(self, node: str, cluster: str | None = None) -> Node:
        """One node with each GPU's health state, sharing mode, holder and latest telemetry."""
        return _parse(Node, self._json("GET", f"/v1/nodes/{_seg(node)}", params={"cluster": cluster}),
                      "/v1/nodes/{node}")

    def cordon(self, node: str, reason: str = "", cluster: str | None = None) -> Node:
        """No new work on the node; running work stays (operators and admins). Idempotent."""
        return self._node_action(node, "cordon", cluster, {"reason": reason})

    def drain(self, node: str, reason: str = "", cluster: str | None = None) -> Node:
        """Cordon and take the node's allocations back (reason Drained; restartable jobs are requeued)."""
        return self._node_action(node, "drain", cluster, {"reason": reason})

    def uncordon(self, node: str, cluster: str | None = None) -> Node:
        return self._node_action(node, "uncordon", cluster, None)

    def _node_action(self, node: str, verb: str, cluster: str | None, body: dict[str, Any] | None) -> Node:
        return _parse(Node, self._json("POST", f"/v1/nodes/{_seg(node)}/{verb}", params={"cluster": cluster},
                                       json_body=body, retry=True), f"/v1/nodes/{{node}}/{verb}")

    def set_gpu_sharing(self, node: str, index: int, mode: str, cluster: str | None = None) -> GpuChange:
        """exclusive, fractional or mig (operators and admins): at once on an empty GPU; a GPU that holds work is
        drained first (`draining_to`) and switched when the work is released."""
        return _parse(GpuChange, self._json("PUT", f"/v1/nodes/{_seg(node)}/gpus/{int(index)}/sharing",
                                            params={"cluster": cluster}, json_body={"mode": mode}, retry=True),
                      "/v1/nodes/{node}/gpus/{index}/sharing")

    def set_gpu_health(self, node: str, index: int, action: str, reason: str = "",
                       cluster: str | None = None) -> GpuChange:
        """`clear` a quarantined GPU (it enters probation) or `quarantine` one now. Not retried: a second clear
        would move a GPU in probation on to healthy."""
        return _parse(GpuChange, self._json("POST", f"/v1/nodes/{_seg(node)}/gpus/{int(index)}/health",
                                            params={"cluster": cluster},
                                            json_body={"action": action, "reason": reason}),
                      "/v1/nodes/{node}/gpus/{index}/health")

    def list_orphans(self, cluster: str | None = None, open_only: bool = True,
                     limit: int | None = None) -> list[Orphan]:
        """Processes on GPUs nobody holds, and allocations whose GPUs run no process (open ones by default)."""
        return self._list(Orphan, "/v1/orphans", {"cluster": cluster, "open": str(open_only).lower()}, limit)

    def pool(self, cluster: str | None = None) -> Pool:
        """GET /v1/pool: per cluster and GPU model total, healthy, in use, allocated, allocated-but-idle, free."""
        return _parse(Pool, self._json("GET", "/v1/pool", params={"cluster": cluster}), "/v1/pool")

    def fragmentation(self, cluster: str | None = None) -> PoolFragmentation:
        """GET /v1/pool/fragmentation: free GPUs per cluster and model that no recent job shape could use."""
        return _parse(PoolFragmentation, self._json("GET", "/v1/pool/fragmentation", params={"cluster": cluster}),
                      "/v1/pool/fragmentation")

    # --- teams, quotas, priority classes (changes: platform admins) ---------------------------------------------
    def list_teams(self) -> list[Team]:
        return self._list(Team, "/v1/teams")

    def create_team(self, team: str, org: str | None = None) -> Team:
        """Create a team (and its org; default "default"). Creating an existing team in the same org is a no-op."""
        body: dict[str, Any] = {"team": team}
        if org is not None:
            body["org"] = org
        return _parse(Team, self._json("POST", "/v1/teams", json_body=body), "/v1/teams")

    def list_quotas(self) -> list[QuotaEntry]:
        return self._list(QuotaEntry, "/v1/quotas")

    def set_quota(self, path: str, gpu_model: str = "*", *, guaranteed: float = 0.0,
                  borrowing_limit: float | None = None, lending_limit: float | None = None,
                  weight: float = 1.0) -> QuotaEntry:
        """Set one quota entry (every field; created if missing). `path` is org, org/team or org/team/project;
        `gpu_model` "*" means any model; `borrowing_limit` None: unlimited; `lending_limit` None: lend all unused."""
        body = {"path": path, "gpu_model": gpu_model, "guaranteed": guaranteed, "borrowing_limit": borrowing_limit,
                "lending_limit": lending_limit, "weight": weight}
        return _parse(QuotaEntry, self._json("PUT", "/v1/quotas", json_body=body, retry=True), "/v1/quotas")

    def delete_quota(self, path: str, gpu_model: str = "*") -> None:
        self.request("DELETE", "/v1/quotas", params={"path": path, "gpu_model": gpu_model})

    def request_quota_loan(self, path: str, gpus: int, until: datetime, reason: str,
                           gpu_model: str = "*") -> dict[str, Any]:
        """Ask for `gpus` extra guaranteed GPUs on a quota entry until `until`: an approval request (kind `loan`)
        that a platform admin approves or denies."""
        return self._json("POST", "/v1/quota-loans", json_body={
            "path": path, "gpu_model": gpu_model, "gpus": gpus, "until": until.isoformat(), "reason": reason})

    def list_quota_loans(self, active: bool = False) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/quota-loans", params={"active": str(active).lower()})["items"]

    def list_priority_classes(self) -> list[PriorityClass]:
        return self._list(PriorityClass, "/v1/priority-classes")

    def set_priority_class(self, name: str, value: int, preemptible: bool, *, min_runtime_s: float | None = None,
                           description: str = "") -> PriorityClass:
        """Create or change a priority class (higher `value` runs first)."""
        body = {"value": value, "preemptible": preemptible, "min_runtime_s": min_runtime_s,
                "description": description}
        return _parse(PriorityClass, self._json("PUT", f"/v1/priority-classes/{_seg(name)}", json_body=body,
                                                retry=True), "/v1/priority-classes/{name}")

    # --- approvals ---------------------------------------------------------------------------------------------
    def list_approvals(self, team: str | None = None, state: str | None = None,
                       limit: int | None = None, kind: str | None = None) -> list[Approval]:
        """Approval requests, newest first; `state` is pending, approved or denied; `kind` job or loan (quota
        loans carry no job). The gateway answers at most 1000 in one list (it has no cursor here)."""
        return self._list(Approval, "/v1/approvals", {"team": team, "state": state, "kind": kind}, limit)

    def approval_rules(self) -> list[ApprovalRule]:
        """The admission rules (gpus_over, runtime_over_s, priority_class) that send a submission to approval."""
        doc = self._json("GET", "/v1/approvals", params={"limit": 1}) or {}
        return [_parse(ApprovalRule, r, "/v1/approvals") for r in doc.get("rules", [])]

    def approve(self, approval_id: str, comment: str = "") -> Approval:
        """Approve a pending request: the job joins the queue."""
        return self._decide(approval_id, "approve", comment)

    def deny(self, approval_id: str, comment: str = "") -> Approval:
        """Deny a pending request: the job fails with ApprovalDenied."""
        return self._decide(approval_id, "deny", comment)

    def _decide(self, approval_id: str, verb: str, comment: str) -> Approval:
        return _parse(Approval, self._json("POST", f"/v1/approvals/{_seg(approval_id)}/{verb}",
                                           json_body={"comment": comment}), f"/v1/approvals/{{id}}/{verb}")

    def set_approval_rule(self, rule: str, value: str | float, enabled: bool = True) -> ApprovalRule:
        """Set an admission rule: `gpus_over` (GPUs), `runtime_over_s` (seconds of declared max runtime) or
        `priority_class` (a class name); `enabled=False` keeps the value but stops applying it."""
        text = value if isinstance(value, str) else f"{value:g}"
        return _parse(ApprovalRule, self._json("PUT", f"/v1/approval-rules/{_seg(rule)}",
                                               json_body={"value": text, "enabled": enabled}, retry=True),
                      "/v1/approval-rules/{rule}")

    # --- reclamation -------------------------------------------------------------------------------------------
    def list_reclaim_policies(self) -> list[ReclaimPolicy]:
        return self._list(ReclaimPolicy, "/v1/reclaim-policies")

    def set_reclaim_policy(self, kind: str, *, idle_after_s: float | None = None, idle_util_pct: float = 5.0,
                           grace_s: float = 300.0, enforce_max_runtime: bool = True) -> ReclaimPolicy:
        """Set (every field of) the reclaim policy of a job kind; `idle_after_s` None: never reclaim for idleness."""
        body = {"idle_after_s": idle_after_s, "idle_util_pct": idle_util_pct, "grace_s": grace_s,
                "enforce_max_runtime": enforce_max_runtime}
        return _parse(ReclaimPolicy, self._json("PUT", f"/v1/reclaim-policies/{_seg(kind)}", json_body=body,
                                                retry=True), "/v1/reclaim-policies/{kind}")

    # --- tokens and audit (admin) --------------------------------------------------------------------------------
    def create_token(self, name: str, role: str, team: str | None = None, expires_in_days: int | None = None,
                     *, never_expires: bool = False) -> CreatedToken:
        """Create an API token. The secret (`.token`) is returned once and never again. Without
        `expires_in_days` the gateway's default expiry applies; `never_expires=True` asks for none."""
        body: dict[str, Any] = {"name": name, "role": role}
        if team is not None:
            body["team"] = team
        if never_expires:
            body["expires_in_days"] = None
        elif expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        return _parse(CreatedToken, self._json("POST", "/v1/tokens", json_body=body), "/v1/tokens")

    def list_tokens(self) -> list[Token]:
        return self._list(Token, "/v1/tokens")

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/v1/tokens/{_seg(token_id)}")

    def audit(self, limit: int | None = 100, action: str | None = None) -> list[AuditEntry]:
        """The newest `limit` audit entries (None: all), optionally of one action (e.g. "token.create")."""
        return self._list(AuditEntry, "/v1/audit", {"action": action}, limit=limit)

    # --- scheduling decisions (platform admins, operators) ----------------------------------------------------
    def list_decisions(self, limit: int | None = 50) -> list[Decision]:
        """Recorded scheduling cycles, newest first."""
        out: list[Decision] = []
        before: str | None = None
        while limit is None or len(out) < limit:
            page = self._json("GET", "/v1/decisions", params={"limit": min(500, (limit or 500) - len(out)),
                                                              **({"before": before} if before else {})})
            out += [_parse(Decision, item, "/v1/decisions") for item in page["items"]]
            if not (before := page.get("next")):
                break
        return out

    def get_decision(self, cycle_id: str) -> Decision:
        """One recorded cycle with its input (gzip + base64 of the core's JSON) and plan."""
        return _parse(Decision, self._json("GET", f"/v1/decisions/{_seg(cycle_id)}"), "/v1/decisions/{id}")

    def whoami(self) -> WhoAmI:
        """Who the token authenticates as: subject, role, team and the actions it allows."""
        return _parse(WhoAmI, self._json("GET", "/v1/whoami"), "/v1/whoami")

    # --- ops ---------------------------------------------------------------------------------------------------
    def ready(self) -> Readiness:
        """GET /readyz: whether every service answers. A 503 is an answer here ("not ready"), not an error."""
        resp = self.request("GET", "/readyz", retry=False, ok_statuses=(503,))
        try:
            return Readiness.from_api(resp.json())
        except ValueError:
            return Readiness(status="not ready")


def _parse(model: type[M], data: Any, path: str) -> M:
    """A response object as `model`; a shape the client cannot read is a GpupoolError, not a pydantic trace."""
    try:
        return model.from_api(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise GpupoolError(0, "InvalidResponse", f"cannot read the gateway's answer from {path}: {where}: "
                                                 f"{first['msg']}", {}) from None
