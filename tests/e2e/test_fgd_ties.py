"""The default policy's fragmentation score on a running platform, as FGD's artifact scores it: a whole number, and
near-equal choices tied with the tie going to the lowest node index (which packs, as first fit does) rather than
to the fuller node."""

from __future__ import annotations

import pytest
from support import finish_all, node_of, submit

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
# sim-node-0 is labelled zone=east, sim-node-1 zone=west: the simulated fleet's labels
UP_ARGS = ["--fleet", "H100-80GB*8@zone=east;H100-80GB*8@zone=west", "--env", "placement:MIN_RUNTIME_S=0"]


def test_a_tie_in_fragmentation_goes_to_the_lowest_node_not_to_the_fuller_one(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        held = submit(api, "held", "research", 1, node_selector={"zone": "west"})
        assert node_of(api, held) == "sim-node-1"
        # a whole GPU leaves no fragment on either node (every GPU left is whole): the same whole-number score. The
        # earlier default broke such ties toward the fuller node (sim-node-1); FGD's rule takes the lowest index
        free = submit(api, "free", "research", 1)
        assert node_of(api, free) == "sim-node-0"
        finish_all(api)
