"""Network addresses in the contracts: where a node's peers reach it (registered by its agent)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field


def peer_address(value: str) -> str:
    """Where a node's peers (a gang's other members) reach it: an IPv4 or IPv6 address, or a DNS host name; '' when
    the agent did not say."""
    if value == "":
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in value.rstrip(".").split(".")):
        raise ValueError(f"{value!r} is neither an IP address nor a host name")
    return value


_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
PeerAddress = Annotated[str, AfterValidator(peer_address), Field(default="", max_length=253, description=(
    "Where the node's peers reach it (a gang's rendezvous): an IP address or a host name; '' if not reported"))]
