"""The benchmarks' harness waits for its fleet through `/v1/nodes`, which answers one page at a time (issue #21:
`gpupool bench backlog --nodes 128` never started, as it only ever saw the first 100 nodes). A fake gateway with
the endpoint's paging (default page 100, `next` = the last node's key, `cursor` = where to go on) stands in for it."""

from __future__ import annotations

import time

import httpx
import pytest

from libs.bench.e2e import registered_nodes, wait_for_fleet


class FakeNodes:
    """`GET /v1/nodes` keyset-paginated like the gateway's; `registering` more nodes appear at each full listing."""

    def __init__(self, registered: int, registering: int = 0, total: int = 0) -> None:
        self.registered, self.registering, self.total = registered, registering, max(total, registered)
        self.requests: list[httpx.URL] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request.url)
        assert request.url.path == "/v1/nodes"
        limit = int(request.url.params.get("limit", 100))
        names = [f"node-{i:03d}" for i in range(self.registered)]
        after = request.url.params.get("cursor")
        rows = [n for n in names if after is None or n > after][:limit + 1]
        items = [{"cluster": "bench", "node": n} for n in rows[:limit]]
        more = len(rows) > limit
        if not more:  # a full listing: the fleet goes on registering
            self.registered = min(self.total, self.registered + self.registering)
        return httpx.Response(200, json={"items": items, "next": items[-1]["node"] if more else None})


def client(fake: FakeNodes) -> httpx.Client:
    return httpx.Client(base_url="http://gateway", transport=httpx.MockTransport(fake))


def test_128_nodes_are_counted_across_two_pages() -> None:
    fake = FakeNodes(128)
    with client(fake) as api:
        assert registered_nodes(api) == 128
    assert [u.params.get("cursor") for u in fake.requests] == [None, "node-099"]


def test_the_harness_waits_for_all_128_nodes_not_the_first_page() -> None:
    fake = FakeNodes(registered=40, registering=30, total=128)
    with client(fake) as api:
        wait_for_fleet(api, 128, deadline=time.monotonic() + 10, pause_s=0)
        assert fake.registered == 128 and registered_nodes(api) == 128


def test_a_fleet_short_of_its_size_times_out_saying_how_many_registered() -> None:
    with client(FakeNodes(127)) as api, pytest.raises(RuntimeError, match="127 of 128 nodes"):
        wait_for_fleet(api, 128, deadline=time.monotonic() + 0.05, pause_s=0.01)


def test_a_gateway_not_ready_yet_counts_as_none_listed() -> None:
    answers = iter([httpx.Response(503, json={"title": "not ready", "status": 503}),
                    httpx.Response(200, json={"items": [{"node": "node-000"}], "next": None})])
    with httpx.Client(base_url="http://gateway", transport=httpx.MockTransport(lambda r: next(answers))) as api:
        wait_for_fleet(api, 1, deadline=time.monotonic() + 10, pause_s=0)
