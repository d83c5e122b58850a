"""`gpupool node|cordon|uncordon|drain|sharing|gpu-health|orphans` and the client calls under them, against a fake
gateway: the right requests go out (path, query, body, retries) and the answers are rendered."""

from __future__ import annotations

import json

import httpx
import pytest
from cli_fakes import NOW, FakeGateway, gpu, node, problem

from libs.cli import common
from libs.cli.main import main
from libs.client import GpupoolClient


@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        args.url or "http://gw.test", args.token or "tok", transport=fake.transport, sleep=lambda _s: None))
    return fake


def managed_node(**over) -> dict:  # type: ignore[no-untyped-def]
    g0 = {**gpu(0, util=97.0), "state": "quarantined", "state_reason": "FatalXid", "state_since": NOW,
          "sharing": "exclusive", "allocation_id": None}
    g1 = {**gpu(1, util=2.0), "state": "healthy", "state_reason": "", "sharing": "fractional",
          "allocation_id": "a-7"}
    g1["telemetry"]["process_count"] = 2
    doc = {**node("n0", [g0, g1]), "cordoned": True, "drained": False,
           "cordon": {"at": NOW, "by": "ops", "reason": "kernel upgrade"}}
    doc.update(over)
    return doc


def test_node_shows_each_gpus_state_reason_sharing_and_holder(gw, capsys):
    gw.on("GET", "/v1/nodes/n0", managed_node())
    assert main(["node", "n0"]) == 0
    out = capsys.readouterr().out
    assert "cordoned by ops: kernel upgrade" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("GPU"))
    assert lines[header + 1].split()[:4] == ["0", "H100-80GB", "quarantined", "FatalXid"]
    assert lines[header + 2].split()[-4:] == ["fractional", "2", "2", "a-7"]


@pytest.mark.parametrize("action", ["cordon", "drain"])
def test_cordon_and_drain_post_the_reason_and_say_what_the_node_is_now(gw, capsys, action):
    seen = {}

    def answer(request: httpx.Request):  # type: ignore[no-untyped-def]
        seen["body"], seen["query"] = json.loads(request.content), dict(request.url.params)
        return managed_node(drained=action == "drain")

    gw.on("POST", f"/v1/nodes/n0/{action}", answer)
    assert main([action, "n0", "--reason", "rack swap", "--cluster", "east"]) == 0
    assert seen == {"body": {"reason": "rack swap"}, "query": {"cluster": "east"}}
    state = "drained" if action == "drain" else "cordoned"
    assert capsys.readouterr().out == f"node sim/n0 is {state}\n"


def test_uncordon_sends_no_body_and_is_retried_on_503(gw, capsys):
    answers = iter([problem(503, "ServiceUnavailable", "retry"), managed_node(cordoned=False, cordon=None)])
    gw.on("POST", "/v1/nodes/n0/uncordon", lambda _req: next(answers))
    assert main(["uncordon", "n0"]) == 0
    assert capsys.readouterr().out == "node sim/n0 is schedulable\n"
    assert len(gw.calls) == 2 and gw.calls[-1].content == b""


def test_sharing_puts_the_mode_of_one_gpu(gw, capsys):
    gw.on("PUT", "/v1/nodes/n0/gpus/3/sharing", lambda req: {
        "cluster": "sim", "node": "n0", "index": 3, "gpu_uuid": "GPU-3", "before": "exclusive",
        "mode": json.loads(req.content)["mode"], "changed": True})
    assert main(["sharing", "n0", "3", "mig"]) == 0
    assert capsys.readouterr().out == "GPU 3 on sim/n0: mig\n"
    with pytest.raises(SystemExit):
        main(["sharing", "n0", "3", "halves"])


def test_gpu_health_clear_is_not_retried_and_reports_the_move(gw, capsys):
    answers = iter([problem(503, "ServiceUnavailable", "later")])
    gw.on("POST", "/v1/nodes/n0/gpus/0/health", lambda _req: next(answers))
    assert main(["gpu-health", "n0", "0", "clear", "--reason", "reset done"]) == 1
    assert len(gw.calls) == 1 and json.loads(gw.calls[0].content) == {"action": "clear", "reason": "reset done"}
    capsys.readouterr()
    gw.on("POST", "/v1/nodes/n0/gpus/0/health", {"cluster": "sim", "node": "n0", "index": 0, "gpu_uuid": "GPU-0",
                                                   "before": "quarantined", "state": "probation", "changed": True,
                                                   "reason": "ClearedByOperator"})
    assert main(["gpu-health", "n0", "0", "clear"]) == 0
    assert capsys.readouterr().out == "GPU 0 on sim/n0: quarantined -> probation\n"


def test_a_forbidden_cordon_is_one_line_and_exit_1(gw, capsys):
    gw.on("POST", "/v1/nodes/n0/cordon", problem(403, "Forbidden", "role 'member' may not node.manage"))
    assert main(["cordon", "n0"]) == 1
    assert capsys.readouterr().err == "error: Forbidden: role 'member' may not node.manage (HTTP 403)\n"


def test_orphans_lists_open_ones_unless_all_is_asked(gw, capsys):
    seen = []

    def answer(request: httpx.Request):  # type: ignore[no-untyped-def]
        seen.append(request.url.params.get("open"))
        return {"items": [{"id": 1, "kind": "process_without_allocation", "cluster": "sim", "node": "n0",
                           "gpu_uuid": "GPU-1", "since": NOW, "detected_at": NOW, "resolved_at": None}],
                "next": None}

    gw.on("GET", "/v1/orphans", answer)
    assert main(["orphans"]) == 0 and main(["orphans", "--all", "-o", "json"]) == 0
    assert seen == ["true", "false"]
    out = capsys.readouterr().out
    assert "process_without_allocation  sim/n0  GPU-1" in out


def test_nodes_table_marks_cordoned_and_drained_nodes(gw, capsys):
    gw.on("GET", "/v1/nodes", {"items": [managed_node(), {**managed_node(drained=True), "node": "n1"},
                                         {**managed_node(cordoned=False, cordon=None), "node": "n2"}], "next": None})
    assert main(["nodes"]) == 0
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [["sim", "n0", "ready", "(cordoned)"], ["sim", "n1", "ready", "(drained)"], ["sim", "n2", "ready", "2"]]
