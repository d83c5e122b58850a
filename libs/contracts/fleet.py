"""The simulated fleet's description, shared by the agent that runs it and `gpupool up`, which issues each of its
nodes a NATS identity before the agent starts."""

from __future__ import annotations

DEFAULT_SIM_FLEET = "H100-80GB*8;A100-80GB*8;H200-141GB*8;L40S*8"


def parse_fleet(spec: str) -> list[list[str]]:
    """'H100-80GB*8;L40S*4,T4*2' → [['H100-80GB']*8, ['L40S']*4 + ['T4']*2]."""
    nodes: list[list[str]] = []
    for node_spec in filter(None, (s.strip() for s in spec.split(";"))):
        models: list[str] = []
        for part in filter(None, (p.strip() for p in node_spec.split(","))):
            model, _, count = part.partition("*")
            if count and not count.isdigit():
                raise ValueError(f"bad GPU count in {part!r}; expected MODEL*COUNT")
            models += [model.strip()] * (int(count) if count else 1)
        nodes.append(models)
    return nodes


def sim_node_names(prefix: str, spec: str) -> list[str]:
    """The names the agent gives the simulated nodes of `spec`."""
    return [f"{prefix}-{i}" for i in range(len(parse_fleet(spec)))]
