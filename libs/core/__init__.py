"""gpupool's pure scheduling core: standard library only, no I/O, time and randomness injected.

The placement service and the trace simulator run exactly this code, so what the simulator measures is
what production does. See README.md in this folder for the pipeline and vocabulary.
"""

from libs.core.cycle import (
    derive_typical,
    derive_workload,
    job_spec,
    mix_of,
    request_spec,
    typical_requests,
    workload_from_counts,
)
from libs.core.frag import FragmentationRow, measure_fragmentation
from libs.core.mig import CATALOGUE as MIG_CATALOGUE
from libs.core.mig import MigProfile, plan_gpu_layout, valid_layout
from libs.core.migplan import plan_mig_layouts
from libs.core.model import (
    EXCLUSIVE,
    FRACTIONAL,
    MIG,
    Allocation,
    Gpu,
    JobRequest,
    MigInstance,
    Node,
    Share,
    Snapshot,
    UsageRecord,
)
from libs.core.plan import MigReconfig, PendingReason, Placement, Plan, Preemption, Reservation
from libs.core.policy import (
    DEFAULT_KINDS,
    DEFAULT_PRIORITY_CLASSES,
    KindPolicy,
    Policy,
    PriorityClass,
    QuotaEntry,
    QuotaTree,
    WorkloadShape,
)
from libs.core.quota import teams_quota
from libs.core.schedule import NormalizeMemo, Scheduler, schedule

__all__ = [
    "DEFAULT_KINDS",
    "DEFAULT_PRIORITY_CLASSES",
    "EXCLUSIVE",
    "FRACTIONAL",
    "FragmentationRow",
    "MIG",
    "MIG_CATALOGUE",
    "Allocation",
    "Gpu",
    "JobRequest",
    "KindPolicy",
    "MigInstance",
    "MigProfile",
    "MigReconfig",
    "Node",
    "PendingReason",
    "NormalizeMemo",
    "Placement",
    "Plan",
    "Policy",
    "Preemption",
    "PriorityClass",
    "QuotaEntry",
    "QuotaTree",
    "Reservation",
    "Scheduler",
    "Share",
    "Snapshot",
    "UsageRecord",
    "WorkloadShape",
    "derive_typical",
    "derive_workload",
    "job_spec",
    "mix_of",
    "request_spec",
    "measure_fragmentation",
    "plan_gpu_layout",
    "plan_mig_layouts",
    "schedule",
    "teams_quota",
    "valid_layout",
    "typical_requests",
    "workload_from_counts",
]
