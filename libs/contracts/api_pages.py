"""The HTTP API's list pages and the answers that are not one of libs/contracts/api.py's resources. Like those, every
model allows extra fields and defaults what may be missing: the gateway documents its responses with them (without
filtering what it sends), the typed client parses into them."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from libs.contracts.api import (
    Allocation,
    ApiModel,
    Approval,
    ApprovalRule,
    AuditEntry,
    Decision,
    Job,
    Node,
    NodeOrphan,
    PriorityClass,
    QuotaEntry,
    ReclaimPolicy,
    Team,
    Token,
    UsageRecord,
)

_NEXT = "the cursor of the following page (pass it as `cursor`); null: this is the last page"


class JobPage(ApiModel):
    items: list[Job] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)


class NodePage(ApiModel):
    items: list[Node] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)


class AllocationPage(ApiModel):
    items: list[Allocation] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)


class UsagePage(ApiModel):
    items: list[UsageRecord] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)


class OrphanPage(ApiModel):
    items: list[NodeOrphan] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)


class TeamList(ApiModel):
    items: list[Team] = Field(default_factory=list)
    next: str | None = Field(default=None, description="always null: every team in one page")


class QuotaEntryList(ApiModel):
    items: list[QuotaEntry] = Field(default_factory=list)
    next: str | None = Field(default=None, description="always null: the whole tree in one page")


class PriorityClassList(ApiModel):
    items: list[PriorityClass] = Field(default_factory=list)
    next: str | None = Field(default=None, description="always null")


class ReclaimPolicyList(ApiModel):
    items: list[ReclaimPolicy] = Field(default_factory=list)
    next: str | None = Field(default=None, description="always null")


class ApprovalPage(ApiModel):
    items: list[Approval] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)
    rules: list[ApprovalRule] = Field(default_factory=list, description="the admission rules that ask for approval")


class TokenPage(ApiModel):
    items: list[Token] = Field(default_factory=list)
    next: str | None = Field(default=None, description=_NEXT)


class AuditPage(ApiModel):
    items: list[AuditEntry] = Field(default_factory=list)
    next: int | None = Field(default=None, description=_NEXT)


class DecisionPage(ApiModel):
    items: list[Decision] = Field(default_factory=list)
    next: str | None = Field(default=None, description="the cursor (`before`) of the following, older page")


class QuotaLoan(ApiModel):
    """A quota loan granted by an approved request (`loan_id` is that approval's id)."""

    loan_id: str
    path: str = ""
    gpu_model: str = "*"
    gpus: float = 0
    until: datetime | None = None
    reason: str = ""
    granted_by: str = ""
    granted_at: datetime | None = None
    expired_at: datetime | None = Field(default=None, description="set once the loan ended")


class QuotaLoanList(ApiModel):
    items: list[QuotaLoan] = Field(default_factory=list)
    next: str | None = Field(default=None, description="always null")


class TrackedAllocation(ApiModel):
    """A live allocation the reclamation service watches, with its idle time from telemetry."""

    allocation_id: str
    job_id: str = ""
    team: str = ""
    cluster: str = ""
    node: str = ""
    kind: str = ""
    gpu_uuids: list[str] = Field(default_factory=list)
    granted_at: datetime | None = None
    last_busy_at: datetime | None = None
    idle_s: float = 0.0
    mean_util_pct: float | None = None
    max_util_pct: float | None = None
    warned_at: datetime | None = None
    reclaim_deadline: datetime | None = None
    reclaim_reason: str | None = None


class TrackedList(ApiModel):
    items: list[TrackedAllocation] = Field(default_factory=list)
    next: str | None = Field(default=None, description="always null")


class Endpoint(ApiModel):
    """Where one live replica of a job serves."""

    replica: int = 0
    node: str = ""
    cluster: str = ""
    allocation_id: str = ""
    url: str | None = Field(default=None, description="null until its agent announced it")
    ports: dict[str, int] = Field(default_factory=dict, description="every named port → host port")
    ready: bool = False
    since: datetime | None = None
    reason: str | None = Field(default=None, description="why it is not ready")


class Endpoints(ApiModel):
    job_id: str
    items: list[Endpoint] = Field(default_factory=list)


class LoadReport(ApiModel):
    """A service's load as its autoscaler keeps it: the reporter's latest value."""

    job_id: str
    reporter: str = ""
    value: float = 0.0
    at: datetime | None = None


class Health(ApiModel):
    status: str = Field(default="ok", description="ok while the process serves")


class TeamCreated(Team):
    """The team (created now, or already there in the same org)."""

    revision: int | None = None
    created_at: datetime | None = None

