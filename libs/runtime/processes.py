"""Processes by pid, as supervisors (gpupool up) and the agent (its MPS daemons) see them."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Running (a zombie, killed but not yet reaped, is not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is not running.
    with contextlib.suppress(OSError):
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    return True
