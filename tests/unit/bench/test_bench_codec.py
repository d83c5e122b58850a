"""The codec micro-benchmark measures what it says: every encoder's document decodes to the event it was given and
every decoder gives the event back (checked inside `run` before anything is timed)."""

from __future__ import annotations

from libs.bench import codec


def test_every_variant_round_trips_and_is_timed() -> None:
    result = codec.run(n=30)
    assert "pydantic (to_cloudevent + to_json)" in result["encode"]
    assert {"pydantic (parse_envelope + decode_data)", "pydantic one pass (typed envelope)"} <= set(result["decode"])
    assert all(v >= 0 for section in ("encode", "decode", "validation") for v in result[section].values())
    assert result["size_bytes"]["AllocationGranted"] > result["size_bytes"]["JobStateChanged"] > 0
