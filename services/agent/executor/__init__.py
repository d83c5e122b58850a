"""The node's executor: runs each attempt's work under a per-attempt shim, in its own cgroup, isolated by a driver
(process, sandbox, container), and reports every exit once. See README.md in this folder.

The names below are imported lazily: the shim (`services.agent.executor.shim`) imports this package on every job's
start path and must not pay for the executor (which imports the agent's domain and pydantic)."""

from __future__ import annotations

__all__ = ["Executor", "ExitReport", "LaunchError", "LaunchSpec", "Limits"]


def __getattr__(name: str) -> object:
    if name == "Executor":
        from services.agent.executor.executor import Executor

        return Executor
    if name in ("ExitReport", "LaunchError", "LaunchSpec", "Limits"):
        from services.agent.executor import spec

        return getattr(spec, name)
    raise AttributeError(name)
