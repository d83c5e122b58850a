"""Connecting to NATS and declaring gpupool's JetStream streams from the contracts."""

from __future__ import annotations

import asyncio
import logging

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError, ServerError, ServiceUnavailableError

from libs.contracts import subjects
from libs.contracts.subjects import STREAMS, StreamSpec

log = logging.getLogger(__name__)

# Re-exported so that code outside libs/bus never imports nats directly.
NatsClient = NATS
Message = Msg


def identity_inbox(identity: str, inbox_prefix: str | None, nkey_file: str | None) -> str | None:
    """The inbox prefix an identity connects with: the one configured, else, for an nkey identity, its own
    (`_INBOX_<identity>`, the only inbox its permissions allow), else the client's default."""
    if inbox_prefix:
        return inbox_prefix
    return subjects.inbox_prefix(identity) if nkey_file else None


async def connect(url: str, name: str, *, user: str | None = None, password: str | None = None,
                  nkey_file: str | None = None, inbox_prefix: str | None = None,
                  connect_timeout: float = 5.0) -> NATS:
    """Connect with endless reconnects: a service outlives a NATS restart instead of crashing with it. `url` may
    list several servers of a cluster, comma-separated; the client fails over between them.

    `nkey_file`: the identity's nkey seed file (`.nk`, NATS's standard nkey authentication: the seed signs the
    server's nonce and never leaves the machine). `inbox_prefix`: where this identity's replies arrive
    (`_INBOX_<identity>`); the server lets each identity subscribe only to its own."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats_error", extra={"error": str(exc)})

    async def on_disconnect() -> None:
        log.warning("nats_disconnected")

    async def on_reconnect() -> None:
        log.info("nats_reconnected")

    return await nats.connect(
        servers=[u.strip() for u in url.split(",") if u.strip()],
        name=name,
        user=user,
        password=password,
        nkeys_seed=nkey_file or None,
        inbox_prefix=inbox_prefix or "_INBOX",
        connect_timeout=connect_timeout,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    """The stream as the contracts declare it, kept on ``replicas`` servers of a JetStream cluster (1: one node)."""
    if replicas < 1:
        raise ValueError("replicas must be at least 1")
    return StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        duplicate_window=spec.duplicate_window_s,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        num_replicas=replicas,
    )


async def ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...] = STREAMS, *,
                         replicas: int | None = None) -> None:
    """Create or update each stream so its config matches the contracts (idempotent; every service calls it).

    ``replicas`` > 1 needs a JetStream cluster of at least that many servers. None keeps an existing stream's
    replicas (and creates with 1), so a caller that was not told the cluster's size never shrinks a stream."""
    for spec in specs:
        for attempt in range(1, _DECLARE_TRIES + 1):
            try:
                await _declare(js, spec, replicas)
                break
            except (NatsTimeoutError, ServiceUnavailableError, BadRequestError, ServerError) as exc:
                # a JetStream cluster that just formed (or lost a node) may take a while to place replicas: it
                # times out, answers 503, or says no peer is ready yet (10005); a server still removing a stream
                # of that name may fail to create its store (500, 10049: seen in CI right after a delete);
                # anything else is a real error
                if isinstance(exc, BadRequestError) and exc.err_code != 10005:
                    raise
                if isinstance(exc, ServerError) and exc.err_code != 10049:
                    raise
                if attempt == _DECLARE_TRIES:
                    raise
                log.warning("stream_declare_retry", extra={"stream": spec.name, "attempt": attempt})
                await asyncio.sleep(min(5.0, 0.5 * attempt))


_DECLARE_TRIES = 8


async def wait_for_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...] = STREAMS, *,
                           timeout: float = 60.0) -> None:
    """Wait until each stream exists, declaring none: for identities that may look streams up but not create or
    change them (the provisioning identity declares them, `gpupool up`'s supervisor or an init job)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for spec in specs:
        while True:
            try:
                await js.stream_info(spec.name)
                break
            except (NotFoundError, NatsTimeoutError, ServiceUnavailableError):
                if loop.time() > deadline:
                    raise RuntimeError(f"stream {spec.name} does not exist: the provisioning identity declares it "
                                       f"(gpupool up does at start)") from None
                log.info("stream_awaited", extra={"stream": spec.name})
                await asyncio.sleep(0.5)


async def _declare(js: JetStreamContext, spec: StreamSpec, replicas: int | None) -> None:
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(stream_config(spec, replicas or 1))
        log.info("stream_created", extra={"stream": spec.name, "replicas": replicas or 1})
    else:
        keep = info.config.num_replicas or 1
        wanted = stream_config(spec, replicas or keep)
        await js.update_stream(wanted)
