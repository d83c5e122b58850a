"""The executor's own files, without processes: an attempt's record is a journal whose last whole line counts (a
line cut short by a crash is cut off, never joined to the next); a log that never rotated has no index and still
reads; the shim's JSON writer writes what `json` reads back."""

from __future__ import annotations

import json
import os

import pytest

from services.agent.executor import state as st
from services.agent.executor.logs import RotatingLog, dumps, read_log
from services.agent.executor.spec import LaunchSpec


def attempt(tmp_path, alloc: str = "a1") -> st.Attempt:
    d = tmp_path / "attempts" / alloc
    d.mkdir(parents=True)
    return st.Attempt(spec=LaunchSpec(allocation_id=alloc, job_id="j", argv=["true"], env={"A": "1"}),
                      attempt_dir=str(d), workdir=str(d / "w"), workdir_made=True, checkpoint_dir="c",
                      control_dir="k", deadline_file="k/d", cgroup={"kind": "none"}, launchers=[],
                      container_name="x", launched_at=1.0)


def test_the_last_whole_line_of_a_record_is_the_attempt(tmp_path) -> None:
    rec = attempt(tmp_path)
    st.save(rec)
    rec.state, rec.pid = "running", 42
    st.save(rec)
    loaded, unrecorded = st.load(str(tmp_path))
    assert unrecorded == [] and loaded["a1"].state == "running" and loaded["a1"].pid == 42
    assert loaded["a1"].spec == rec.spec
    assert len(open(st.record_path(rec.attempt_dir)).read().splitlines()) == 2  # appended, not rewritten


def test_a_line_cut_short_by_a_crash_is_cut_off_and_the_next_save_is_read(tmp_path) -> None:
    rec = attempt(tmp_path)
    st.save(rec)
    path = st.record_path(rec.attempt_dir)
    with open(path, "ab") as f:
        f.write(b'{"version":1,"attempt":{"spec"')  # the crash
    loaded, _ = st.load(str(tmp_path))
    assert loaded["a1"].state == "starting"
    assert open(path, "rb").read().endswith(b"}\n")  # the torn part is gone
    rec.state = "ended"
    st.save(rec)
    assert st.load(str(tmp_path))[0]["a1"].state == "ended"


def test_an_attempt_dir_without_a_whole_record_line_is_unrecorded(tmp_path) -> None:
    rec = attempt(tmp_path)
    with open(st.record_path(rec.attempt_dir), "wb") as f:
        f.write(b'{"version":1,"att')
    (tmp_path / "attempts" / "bare").mkdir()
    loaded, unrecorded = st.load(str(tmp_path))
    assert loaded == {} and sorted(os.path.basename(u) for u in unrecorded) == ["a1", "bare"]


def test_an_unknown_record_version_is_refused(tmp_path) -> None:
    rec = attempt(tmp_path)
    with open(st.record_path(rec.attempt_dir), "w") as f:
        f.write(json.dumps({"version": 99, "attempt": {}}) + "\n")
    with pytest.raises(ValueError, match="unknown state version"):
        st.load(str(tmp_path))


def test_a_log_that_never_rotated_has_no_index_and_reads_from_zero(tmp_path) -> None:
    path = str(tmp_path / "stdout.log")
    log = RotatingLog(path, 1024)
    log.write(b"hello\n")
    assert not os.path.exists(path + ".idx")
    assert read_log(path) == (b"hello\n", 6, 6)
    log.write(b"x" * 2000)  # rotates: the index appears, offsets go on counting
    assert os.path.exists(path + ".idx")
    data, nxt, end = read_log(path, offset=0, limit=10_000)
    assert end == 2006 and nxt == end and data.endswith(b"x" * 100)
    log.close()
    assert read_log(str(tmp_path / "missing.log")) == (b"", 0, 0)


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [1.5, None, True, False], "c": {"d": -3, "e": 1e-9, "f": 123456789.123}},
    {"s": 'quote " back \\ newline \n tab \t ctl \x01 del \x7f é 漢 surrogate \udcff'},
    [], {}, "", 0.1, 2**70, (1, 2),
])
def test_the_shims_json_writer_writes_what_json_reads_back(value) -> None:
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))


def test_the_shims_json_writer_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError):
        dumps(float("nan"))
    with pytest.raises(TypeError):
        dumps({"x": object()})
