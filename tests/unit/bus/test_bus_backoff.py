"""The consumer's retry delay: exponential from the base, capped, never negative or zero."""

from __future__ import annotations

import pytest

from libs.bus.consumer import ConsumerSpec, backoff_delay
from libs.bus.publisher import MSG_ID_HEADER
from libs.store.outbox_relay import MSG_ID_HEADER as RELAY_MSG_ID_HEADER


def _spec(**kw: float) -> ConsumerSpec:
    return ConsumerSpec(stream="S", durable="d", filter_subjects=("a.>",), **kw)  # type: ignore[arg-type]


def test_backoff_doubles_from_the_base_per_delivery() -> None:
    spec = _spec(backoff_base_s=0.2, backoff_max_s=100)
    assert [backoff_delay(spec, n) for n in (1, 2, 3, 4)] == pytest.approx([0.2, 0.4, 0.8, 1.6])


def test_backoff_is_capped_at_the_maximum() -> None:
    spec = _spec(backoff_base_s=0.2, backoff_max_s=10)
    assert backoff_delay(spec, 50) == 10
    assert backoff_delay(spec, 10_000) == 10  # no overflow for absurd delivery counts


def test_backoff_for_a_zero_or_bogus_delivery_count_is_the_base() -> None:
    spec = _spec(backoff_base_s=0.5, backoff_max_s=10)
    assert backoff_delay(spec, 0) == 0.5
    assert backoff_delay(spec, -3) == 0.5


def test_default_consumer_spec_is_bounded() -> None:
    spec = _spec()
    assert 1 < spec.max_deliver < 100
    assert spec.backoff_max_s <= spec.ack_wait_s  # a nak delay never outlasts the ack deadline budget


def test_relay_and_publisher_use_the_same_dedupe_header() -> None:
    assert MSG_ID_HEADER == RELAY_MSG_ID_HEADER == "Nats-Msg-Id"
