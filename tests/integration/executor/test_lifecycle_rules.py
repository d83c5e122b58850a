"""classify_exit: why an attempt's work ended, from how its main process ended and what happened around it."""

from __future__ import annotations

import pytest

from services.agent.domain import classify_exit


@pytest.mark.parametrize(("exit_code", "signal", "oom", "stopped", "runtime", "reason"), [
    (0, None, False, False, False, "Completed"),
    (3, None, False, False, False, "NonZeroExit"),
    (None, "SIGSEGV", False, False, False, "Signalled"),
    (None, "SIGKILL", True, False, False, "OutOfMemory"),
    (0, None, True, False, False, "OutOfMemory"),  # a child was OOM-killed, the main process coped: still OOM
    (None, "SIGKILL", True, True, False, "OutOfMemory"),  # OOM wins over a stop
    (None, "SIGKILL", True, True, True, "OutOfMemory"),
    (0, None, False, True, False, "Stopped"),  # any exit code after a stop request
    (143, None, False, True, False, "Stopped"),
    (None, "SIGKILL", False, True, False, "Stopped"),
    (None, "SIGKILL", False, True, True, "MaxRuntimeExceeded"),
    (0, None, False, True, True, "MaxRuntimeExceeded"),
    (None, None, False, False, False, "Lost"),
    (None, None, False, True, False, "Stopped"),
])
def test_classify_exit(exit_code, signal, oom, stopped, runtime, reason) -> None:
    assert classify_exit(exit_code, signal, oom, stopped, runtime) == reason


def test_classify_exit_is_pure_and_total() -> None:
    seen = {classify_exit(c, s, o, st, r)
            for c in (None, 0, 1, 255) for s in (None, "SIGTERM") for o in (False, True)
            for st in (False, True) for r in (False, True)}
    assert seen <= {"Completed", "NonZeroExit", "OutOfMemory", "Signalled", "MaxRuntimeExceeded", "Stopped",
                    "Lost"}
