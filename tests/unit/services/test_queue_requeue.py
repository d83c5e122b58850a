"""The queue backs off before wanting a job it lost abnormally again."""

from __future__ import annotations


def test_requeue_back_off_doubles_with_each_abnormal_loss_up_to_a_ceiling() -> None:
    from services.queue.domain import requeue_delay

    assert [requeue_delay(n, 5.0, 300.0) for n in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert requeue_delay(10_000, 5.0, 300.0) == 300
