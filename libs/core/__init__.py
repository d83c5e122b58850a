"""gpupool's pure scheduling core: standard library only, no I/O, time and randomness injected.

The placement service and the trace simulator run exactly this code, so what the simulator measures is
what production does.
"""

from libs.core.model import Gpu, JobRequest, Node, Snapshot
from libs.core.plan import PendingReason, Placement, Plan
from libs.core.schedule import Policy, schedule

__all__ = [
    "Gpu",
    "JobRequest",
    "Node",
    "PendingReason",
    "Placement",
    "Plan",
    "Policy",
    "Snapshot",
    "schedule",
]
