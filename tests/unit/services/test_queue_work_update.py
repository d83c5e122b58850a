"""Updating a service's work: only a replicated service whose work names ports is rolled out; the new command or
env is checked as at submission."""

from __future__ import annotations

import pytest

from libs.contracts.work import WorkSpec
from services.queue.domain import rollout_refusal, updated_work

SERVED = WorkSpec(command=["serve"], ports=["http"], env={"A": "1"})


def test_only_a_replicated_service_with_ports_is_rolled() -> None:
    assert rollout_refusal(SERVED, replica_set=True, gang_nodes=0) is None
    assert "no command" in (rollout_refusal(None, replica_set=True, gang_nodes=0) or "")
    assert "replicated service" in (rollout_refusal(SERVED, replica_set=False, gang_nodes=0) or "")
    assert "replicated service" in (rollout_refusal(SERVED, replica_set=True, gang_nodes=2) or "")
    assert "ports" in (rollout_refusal(WorkSpec(command=["x"]), replica_set=True, gang_nodes=0) or "")


def test_the_new_work_replaces_what_is_given_and_keeps_the_rest() -> None:
    new = updated_work(SERVED, command=None, env={"A": "2"})
    assert (new.command, new.env, new.ports) == (["serve"], {"A": "2"}, ["http"])
    assert updated_work(SERVED, command=["serve", "--v2"], env=None).env == {"A": "1"}
    with pytest.raises(ValueError, match="set by the grant"):
        updated_work(SERVED, command=None, env={"GPUPOOL_X": "1"})
