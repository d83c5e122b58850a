"""Placement writes the queue order (`explain`'s positions) only when it changed other than by jobs leaving it:
`order_still_holds` says when the stored order still gives every waiting job its position."""

from __future__ import annotations

from services.placement.domain import order_still_holds


def test_jobs_that_left_and_wait_no_more_need_no_new_order() -> None:
    written = ("a", "b", "c", "d")
    gone = lambda job: False  # noqa: E731  (none of the missing ones waits)
    assert order_still_holds(written, ("b", "c", "d"), gone)  # the head placed
    assert order_still_holds(written, ("a", "d"), gone)
    assert order_still_holds(written, (), gone)
    assert order_still_holds(written, written, gone)


def test_a_new_job_a_move_or_a_job_that_still_waits_needs_a_new_order() -> None:
    written = ("a", "b", "c", "d")
    assert not order_still_holds(written, ("b", "a", "c", "d"), lambda j: False)  # fair share moved one
    assert not order_still_holds(written, ("a", "b", "c", "d", "e"), lambda j: False)  # an arrival
    assert not order_still_holds(written, ("a", "x", "c"), lambda j: False)
    # `b` left the order but still waits (backing off, or its placement was refused): positions behind it move
    assert not order_still_holds(written, ("a", "c", "d"), lambda j: j == "b")
    assert order_still_holds(written, ("a", "c", "d"), lambda j: j == "a")
    assert not order_still_holds(None, ("a",), lambda j: False)  # nothing known to be written
