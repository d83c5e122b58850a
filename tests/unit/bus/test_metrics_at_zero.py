"""Counters a healthy system never increments exist at 0 from the start (issue #20: dashboards said "No data"
where they should say 0): a consumer's retries, redeliveries and dead letters, a served subject's refusals and
errors, and reclamation's reclaims by reason."""

from __future__ import annotations

from prometheus_client import REGISTRY

from libs.bus.consumer import DEAD_LETTER_REASONS, ConsumerSpec, EventConsumer


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_a_consumer_starts_with_its_failure_counters_at_zero() -> None:
    assert value("gpupool_bus_dead_letters_total", consumer="zero-test", reason="HandlerFailed") is None

    async def handler(event, data) -> None:  # type: ignore[no-untyped-def]
        return None

    EventConsumer(None, ConsumerSpec("S", "zero-test", ("gpupool.x",)), handler)  # type: ignore[arg-type]
    for reason in DEAD_LETTER_REASONS:
        assert value("gpupool_bus_dead_letters_total", consumer="zero-test", reason=reason) == 0.0
    for outcome in ("retried", "dead_lettered"):
        assert value("gpupool_bus_messages_total", consumer="zero-test", outcome=outcome) == 0.0
    assert value("gpupool_bus_redeliveries_total", consumer="zero-test") == 0.0


def test_every_reclaim_reason_is_counted_from_zero() -> None:
    from services.reclamation.domain import RECLAIM_REASONS
    from services.reclamation.handlers import RECLAIMS  # noqa: F401 (defining it registers the series)

    # every reason has its series as soon as the module is imported (a dashboard shows 0, not "No data"); other
    # tests in the same process may have counted reclaims since, so the check is that each exists, not its value
    got = {r: value("gpupool_reclaims_total", reason=r) for r in RECLAIM_REASONS}
    assert None not in got.values(), got
