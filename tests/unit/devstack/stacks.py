"""`gpupool up`'s processes as it would start them, without starting anything: for tests of what each is given."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from libs.devstack import stack as devstack


def started(tmp_path: Path, mp: pytest.MonkeyPatch, **options: Any) -> devstack.Stack:
    """A stack with `StackOptions(data_dir=tmp_path, **options)` whose processes were set up, none started (their
    listening sockets are open: close them, or use `processes`)."""
    st = devstack.Stack(devstack.StackOptions(data_dir=tmp_path, **options))
    st.nats_url = "nats://127.0.0.1:4222"
    st.admin_dsn = "postgresql://postgres@127.0.0.1:5432/postgres"
    st.admin_token = "gpt_" + "x" * 40
    mp.setattr(devstack.ServiceProcess, "start", lambda self: None)
    mp.setattr(devstack.Stack, "wait_ready", lambda self, procs, timeout: None)
    st._start_services(say=lambda *_: None)
    return st


@contextmanager
def processes(tmp_path: Path, mp: pytest.MonkeyPatch, **options: Any) -> Iterator[dict[str, devstack.ServiceProcess]]:
    """`started`'s processes by name; their sockets are closed afterwards."""
    st = started(tmp_path, mp, **options)
    try:
        yield {p.name: p for p in st.processes}
    finally:
        for p in st.processes:
            p.close_listener()
