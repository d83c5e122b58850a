"""`ByObject`: a value derived once per object and found again by the object's identity, never by another
object's, and only the objects of recent calls kept."""

from __future__ import annotations

from libs.core.objmemo import ByObject


def test_each_object_is_derived_once_and_an_equal_new_object_again() -> None:
    calls: list[dict] = []
    memo = ByObject(lambda o: calls.append(o) or o["n"] * 2)
    a, b = {"n": 1}, {"n": 2}
    assert memo.of([a, b]) == [2, 4] and memo.of([b, a, b]) == [4, 2, 4]
    assert calls == [a, b]  # worked out once each
    a2 = {"n": 1}  # equal, another object: derived on its own (its row may say something else next time)
    assert memo.of([a2]) == [2] and calls[-1] is a2
    assert memo.of([a], derive=lambda o: -1) == [2]  # a derive given for this call only works out new ones


def test_values_that_are_none_are_remembered_and_dead_objects_are_never_mistaken() -> None:
    calls: list[int] = []
    memo = ByObject(lambda o: calls.append(1) or None)
    objs = [[i] for i in range(50)]
    assert memo.of(objs) == [None] * 50 and memo.of(objs) == [None] * 50 and len(calls) == 50
    for _ in range(20):  # the objects go, new ones (perhaps at the same addresses) come: each derived afresh
        fresh = [[i] for i in range(50)]
        before = len(calls)
        memo.of(fresh)
        assert len(calls) == before + 50
    assert len(memo._values) <= 2 * 50 + 64 + 50  # what the last calls did not use is dropped
