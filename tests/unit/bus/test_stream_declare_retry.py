"""`ensure_streams` retries the JetStream answers that mean "not yet" and raises every other error at once."""

from __future__ import annotations

import pytest
from nats.js.errors import NotFoundError, ServerError

from libs.bus import connection
from libs.contracts.subjects import STREAMS


class FlakyJetStream:
    """Has no streams; `add_stream` answers with `errors` in turn, then creates."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.created: list[str] = []

    async def stream_info(self, name: str) -> None:
        raise NotFoundError(code=404, err_code=10059, description="stream not found")

    async def add_stream(self, config) -> None:  # type: ignore[no-untyped-def]
        if self.errors:
            raise self.errors.pop(0)
        self.created.append(config.name)


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_: float) -> None:
        return None

    monkeypatch.setattr(connection.asyncio, "sleep", instant)


async def test_a_store_still_being_removed_is_retried_until_the_stream_is_created() -> None:
    js = FlakyJetStream(ServerError(code=500, err_code=10049, description="error creating store for stream"))
    await connection.ensure_streams(js, STREAMS[:1])  # type: ignore[arg-type]
    assert js.created == [STREAMS[0].name]


async def test_any_other_server_error_is_raised_at_once() -> None:
    js = FlakyJetStream(ServerError(code=500, err_code=10001, description="something else"))
    with pytest.raises(ServerError):
        await connection.ensure_streams(js, STREAMS[:1])  # type: ignore[arg-type]
    assert js.created == []
