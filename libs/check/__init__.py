"""`gpupool check`: the platform's invariants verified from the services' stores and the event streams, read-only."""

from libs.check.model import CHECKS, Report, Violation
from libs.check.runner import CheckConfig, check, check_async

__all__ = ["CHECKS", "CheckConfig", "Report", "Violation", "check", "check_async"]
