"""Commands refuse NUL characters (PostgreSQL text cannot hold them) in string fields and in strings inside lists
and mappings, naming the field; everything else passes untouched."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from libs.contracts.commands import ListNodes, RegisterNode, SubmitJob

NODE = {"cluster": "c1", "node": "n1", "hostname": "h1", "cpu_count": 8, "memory_mib": 1024, "gpus": []}


@pytest.mark.parametrize(("command", "fields", "field"), [
    (SubmitJob, {"name": "j1", "team": "t1", "gpus": 1, "submitted_by": "al\x00ice"}, "submitted_by"),
    (SubmitJob, {"name": "j1", "team": "t1", "gpus": 1, "idempotency_key": "\x00"}, "idempotency_key"),
    (SubmitJob, {"name": "j1", "team": "t1", "gpus": 1, "gpu_models": ["H100", "A1\x0000"]}, "gpu_models"),
    (ListNodes, {"cluster": "c\x00"}, "cluster"),
    (RegisterNode, {**NODE, "labels": {"zone": "a\x00"}}, "labels"),
    (RegisterNode, {**NODE, "labels": {"zo\x00ne": "a"}}, "labels"),
    (RegisterNode, {**NODE, "driver_version": "550\x00"}, "driver_version"),
])
def test_nul_anywhere_in_a_string_is_refused_naming_the_field(command: type, fields: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field} must not contain NUL characters"):
        command(**fields)
    with pytest.raises(ValidationError, match=f"{field} must not contain NUL characters"):
        command.model_validate_json(command.model_construct(**fields).model_dump_json())


def test_commands_without_nul_are_accepted_unchanged() -> None:
    job = SubmitJob(name="j1", team="t1", gpus=2, gpu_models=["H100", "A100"], idempotency_key="k-1")
    assert SubmitJob.model_validate_json(job.model_dump_json()) == job
    node = RegisterNode(**{**NODE, "labels": {"zone": "a", "rack": "r2"}})
    assert node.labels == {"zone": "a", "rack": "r2"}
