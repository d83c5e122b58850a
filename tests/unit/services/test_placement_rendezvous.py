"""A job that runs as one gets a rendezvous: each member's torchrun environment and a port reserved on its rank-0
member's host, never one a live job holds there (every loopback address counting as one host); a gang starts when
all its members are ready."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from libs.core import Placement
from services.placement.domain import (
    Member,
    RendezvousPorts,
    choose_port,
    gang_ready,
    gang_start_due,
    port_host,
    rendezvous_environment,
    rollout_step,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def placement(node: str, replica: int, gpus: int = 8) -> Placement:
    return Placement(job_id="g", cluster="c", node=node, gpu_uuids=tuple(f"{node}-{i}" for i in range(gpus)),
                     gpu_indices=tuple(range(gpus)), replica=replica)


def test_each_member_gets_torchruns_conventions_with_rank_zero_as_master() -> None:
    members = [Member(rank=1, cluster="c", node="b", address="10.0.0.2", gpus=8),
               Member(rank=0, cluster="c", node="a", address="10.0.0.1", gpus=8)]
    env = rendezvous_environment("job-1", members, 29501)
    assert set(env) == {0, 1}
    for rank in (0, 1):
        e = env[rank]
        assert (e["PET_NNODES"], e["PET_NPROC_PER_NODE"], e["PET_NODE_RANK"]) == ("2", "8", str(rank))
        assert (e["PET_MASTER_ADDR"], e["PET_MASTER_PORT"], e["PET_RDZV_ID"]) == ("10.0.0.1", "29501", "job-1")
        assert (e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"], e["NODE_RANK"], e["RANK"]) == (
            "10.0.0.1", "29501", "2", str(rank), str(rank))
        assert e["GPUPOOL_NODE_IPS"] == "10.0.0.1,10.0.0.2"
        assert e["PET_RDZV_ENDPOINT"] == "10.0.0.1:29501"


def test_a_node_without_an_address_is_named_instead() -> None:
    env = rendezvous_environment("j", [Member(rank=0, cluster="c", node="gpu-7", address="", gpus=2)], 29500)
    assert (env[0]["MASTER_ADDR"], env[0]["PET_NNODES"], env[0]["PET_NPROC_PER_NODE"]) == ("gpu-7", "1", "2")


def test_every_loopback_address_is_one_host_and_others_their_own() -> None:
    assert port_host("127.0.0.2", "c", "a") == port_host("127.0.0.9", "c", "b") == port_host("::1", "c", "x")
    assert port_host("10.0.0.1", "c", "a") != port_host("10.0.0.2", "c", "a")
    assert port_host("", "c", "a") == "c/a" and port_host("gpu-1.example", "c", "a") == "gpu-1.example"


def test_the_lowest_port_not_held_is_chosen_and_none_when_all_are() -> None:
    assert choose_port(set(), 29500, 29502) == 29500
    assert choose_port({29500, 29502}, 29500, 29502) == 29501
    assert choose_port({29500, 29501, 29502}, 29500, 29502) is None


def test_ports_held_by_live_jobs_and_by_jobs_placed_earlier_in_the_cycle_are_avoided() -> None:
    nodes = [{"cluster": "c", "node": n, "address": f"127.0.0.{i + 2}"} for i, n in enumerate("abc")]
    running = [{"rendezvous_host": "loopback", "rendezvous_port": 29500}, {"rendezvous_port": None}]
    ports = RendezvousPorts.of(nodes, running, (29500, 29502))
    host, port, env = ports.take("g1", [placement("b", 1), placement("a", 0)])  # type: ignore[misc]
    assert (host, port) == ("loopback", 29501)
    assert env[0]["MASTER_ADDR"] == "127.0.0.2" and env[1]["GPUPOOL_NODE_IPS"] == "127.0.0.2,127.0.0.3"
    # another job on another simulated node of the same machine: not the same port
    assert ports.take("g2", [placement("c", 0)])[1] == 29502  # type: ignore[index]
    assert ports.take("g3", [placement("a", 0)]) is None  # the range is used up on this host


def test_a_port_on_one_host_does_not_block_another() -> None:
    nodes = [{"cluster": "c", "node": "a", "address": "10.0.0.1"}, {"cluster": "c", "node": "b", "address": "10.0.0.2"}]
    ports = RendezvousPorts.of(nodes, [{"rendezvous_host": "10.0.0.1", "rendezvous_port": 29500}], (29500, 29999))
    assert ports.take("x", [placement("a", 0)])[1] == 29501  # type: ignore[index]
    assert ports.take("y", [placement("b", 0)])[1] == 29500  # type: ignore[index]


def member_row(ready: bool = True, waiting: bool = True, stopping: bool = False) -> dict:
    return {"gang_wait": waiting, "ready_at": T0 if ready else None, "preempt_deadline": T0 if stopping else None,
            "granted_at": T0}


def test_a_gang_starts_only_with_all_its_members_live_ready_and_not_being_stopped() -> None:
    assert gang_ready([member_row(), member_row()], gang_nodes=2)
    assert not gang_ready([member_row()], gang_nodes=2)  # one member not (or no longer) live
    assert not gang_ready([member_row(), member_row(ready=False)], gang_nodes=2)
    assert not gang_ready([member_row(), member_row(waiting=False)], gang_nodes=2)  # started already
    assert not gang_ready([member_row(), member_row(stopping=True)], gang_nodes=2)
    assert not gang_ready([member_row()], gang_nodes=1)  # a single job never waits


def test_the_gang_start_deadline_is_the_earliest_waiting_grant_plus_the_timeout() -> None:
    later = {**member_row(), "granted_at": T0 + timedelta(seconds=30)}
    assert gang_start_due([later, member_row(), member_row(waiting=False)], 300) == T0 + timedelta(seconds=300)
    assert gang_start_due([member_row(stopping=True), member_row(waiting=False)], 300) is None


def m(replica: int, work: str, ready: bool = True, stopping: bool = False) -> dict:
    return {"allocation_id": f"a{replica}", "replica": replica, "work": work, "ready": ready,
            "preempt_deadline": T0 if stopping else None}


def test_a_rollout_stops_an_old_replica_only_when_the_target_is_ready_without_it() -> None:
    # the surge replica (2) is not ready yet: nothing to stop
    assert rollout_step([m(0, "v1"), m(1, "v1"), m(2, "v2", ready=False)], "v2", 2).action == "wait"
    step = rollout_step([m(0, "v1"), m(1, "v1"), m(2, "v2")], "v2", 2)
    assert (step.action, step.replica) == ("stop", 0)
    # one stop at a time
    assert rollout_step([m(0, "v1", stopping=True), m(1, "v1"), m(2, "v2")], "v2", 2).action == "wait"
    # an old replica that serves nothing goes at once
    step = rollout_step([m(0, "v2", ready=False), m(1, "v1", ready=False), m(2, "v2")], "v2", 2)
    assert (step.action, step.replica) == ("stop", 1)


def test_a_rollout_finishes_only_when_every_replica_that_stays_is_new_and_ready() -> None:
    assert rollout_step([m(0, "v2"), m(2, "v2")], "v2", 2).action == "wait"  # replica 1 not back yet
    assert rollout_step([m(0, "v2"), m(1, "v2", ready=False), m(2, "v2")], "v2", 2).action == "wait"
    assert rollout_step([m(0, "v2"), m(1, "v1", stopping=True), m(2, "v2")], "v2", 2).action == "wait"
    assert rollout_step([m(0, "v2"), m(1, "v2"), m(2, "v2")], "v2", 2).action == "finish"
