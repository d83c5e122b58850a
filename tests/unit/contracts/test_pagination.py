"""The one keyset-pagination rule every list endpoint uses."""

from __future__ import annotations

from libs.contracts.commands import page


def test_an_extra_row_means_a_next_page_whose_cursor_is_the_last_item_shown() -> None:
    doc = page([{"id": i} for i in range(4)], 3, lambda r: {"id": r["id"] * 10}, lambda item: item["id"])
    assert doc == {"items": [{"id": 0}, {"id": 10}, {"id": 20}], "next": 20}


def test_the_last_page_has_no_cursor() -> None:
    assert page([{"id": 1}, {"id": 2}], 3, dict, lambda item: item["id"])["next"] is None
    assert page([], 3, dict, lambda item: item["id"]) == {"items": [], "next": None}
