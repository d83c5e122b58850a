"""The simulated fleet's description, shared by the agent that runs it and `gpupool up`, which issues each of its
nodes a NATS identity before the agent starts.

A fleet is nodes separated by ';', each ``MODEL*COUNT[,MODEL*COUNT][@OPTION[,OPTION]]``. Options shape the node:

* ``rack=R`` / ``block=B``  the node's topology labels (``topology.gpupool.io/rack``, ``/block``): placement packs
  a gang into one rack (block) when it can;
* ``numa=N``                its GPUs split evenly over N NUMA nodes (default 2 for a node of more than one GPU);
* ``nvlink=all|pairs|none`` NVLink among its GPUs: all-to-all (NVSwitch), pairs (0-1, 2-3, ...) or none (default:
  all-to-all for SXM models, none for PCIe cards);
* any other ``KEY=VALUE``: a node label, as is (Kubernetes label syntax; jobs' ``node_selector`` matches it).

e.g. ``H100-80GB*8@rack=r1,nvlink=pairs;L40S*4@rack=r2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.contracts.labels import parse_labels

DEFAULT_SIM_FLEET = "H100-80GB*8;A100-80GB*8;H200-141GB*8;L40S*8"
TOPOLOGY_LABEL_PREFIX = "topology.gpupool.io/"
RACK_LABEL = TOPOLOGY_LABEL_PREFIX + "rack"
BLOCK_LABEL = TOPOLOGY_LABEL_PREFIX + "block"
NVLINK_LAYOUTS = ("auto", "all", "pairs", "none")


@dataclass(frozen=True, slots=True)
class FleetNode:
    """One simulated node: its GPU models by index, labels, NUMA node count (0: the backend's default) and NVLink
    layout."""

    models: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    numa_nodes: int = 0
    nvlink: str = "auto"


def _options(text: str, spec: str) -> tuple[dict[str, str], int, str]:
    labels: dict[str, str] = {}
    numa, nvlink = 0, "auto"
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise ValueError(f"bad node option {part!r} in {spec!r}; expected KEY=VALUE")
        if key in ("rack", "block"):
            labels.update(parse_labels(f"{TOPOLOGY_LABEL_PREFIX}{key}={value}"))
        elif key == "numa":
            if not value.isdigit() or not 1 <= int(value) <= 8:
                raise ValueError(f"bad numa={value!r} in {spec!r}; expected 1..8 NUMA nodes")
            numa = int(value)
        elif key == "nvlink":
            if value not in NVLINK_LAYOUTS:
                raise ValueError(f"bad nvlink={value!r} in {spec!r}; expected one of {', '.join(NVLINK_LAYOUTS)}")
            nvlink = value
        else:
            labels.update(parse_labels(part))
    return labels, numa, nvlink


def parse_fleet_nodes(spec: str) -> list[FleetNode]:
    """'H100-80GB*8@rack=r1;L40S*4,T4*2' → a FleetNode per node (see the module's doc for the options)."""
    nodes: list[FleetNode] = []
    for node_spec in filter(None, (s.strip() for s in spec.split(";"))):
        gpus, _, options = node_spec.partition("@")
        models: list[str] = []
        for part in filter(None, (p.strip() for p in gpus.split(","))):
            model, _, count = part.partition("*")
            if count and not count.isdigit():
                raise ValueError(f"bad GPU count in {part!r}; expected MODEL*COUNT")
            models += [model.strip()] * (int(count) if count else 1)
        labels, numa, nvlink = _options(options, node_spec)
        nodes.append(FleetNode(models, labels, numa, nvlink))
    return nodes


def parse_fleet(spec: str) -> list[list[str]]:
    """'H100-80GB*8;L40S*4,T4*2' → [['H100-80GB']*8, ['L40S']*4 + ['T4']*2] (the nodes' options left out)."""
    return [n.models for n in parse_fleet_nodes(spec)]


def sim_node_names(prefix: str, spec: str) -> list[str]:
    """The names the agent gives the simulated nodes of `spec`."""
    return [f"{prefix}-{i}" for i in range(len(parse_fleet(spec)))]
