"""Reason codes (CamelCase, stable: other services match on them). Every pending job gets one, with a message."""

INVALID_REQUEST = "InvalidRequest"
QUOTA_EXCEEDED = "QuotaExceeded"
NO_FEASIBLE_NODE = "NoFeasibleNode"
# it could not fit this pool even with every schedulable node empty (too big, too many members): waiting is futile
# until the pool grows (re-checked every cycle)
UNSCHEDULABLE = "Unschedulable"
# no schedulable node carries every label of the job's node_selector (room elsewhere would not help)
NO_NODE_MATCHES_SELECTOR = "NoNodeMatchesSelector"
WAITING_FOR_GANG = "WaitingForGang"
RESERVED_FOR_GANG = "ReservedForGang"
PREEMPTING = "Preempting"
BLOCKED_BY_QUEUE_HEAD = "BlockedByQueueHead"
PREEMPTED_BY_PRIORITY = "PreemptedByPriority"
RECLAIMED_FOR_GUARANTEE = "ReclaimedForGuarantee"
# a victim of lower priority in the quota subtree (team, or project) of a job its quota refused: Kueue's
# withinClusterQueue preemption (the job's own quota, not another team's, is what it takes back)
PREEMPTED_WITHIN_QUOTA = "PreemptedWithinQuota"


