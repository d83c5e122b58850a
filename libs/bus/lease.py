"""Leader election through a lease in NATS KV: the holder renews the key before its TTL runs out; when it stops
(crash, partition), the key expires and a follower's create succeeds.

The lease decides who *works*, not what is *correct*: a paused leader may act for a moment after losing the lease,
so correctness never depends on it (placement's database constraints make double allocation impossible anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from prometheus_client import Gauge

log = logging.getLogger(__name__)

LEASE_BUCKET = "gpupool_leases"
# `replica`, not `instance`: Prometheus sets its own `instance` label (the scrape target) on every series, and a
# series' own `instance` would clash with it (renamed to `exported_instance`, or overwriting the target's)
LEADER = Gauge("gpupool_leader", "1 while this replica holds its service's leader lease", ["service", "replica"])


class LeaderLease:
    def __init__(self, js: JetStreamContext, service: str, instance: str, *, ttl_s: float = 3.0,
                 renew_every_s: float = 1.0, replicas: int | None = None) -> None:
        if renew_every_s * 2 > ttl_s:
            raise ValueError("renew at least twice per TTL, or a slow renewal loses the lease")
        self.js = js
        self.service = service
        self.instance = instance
        self.ttl_s = ttl_s
        self.renew_every_s = renew_every_s
        self.replicas = replicas or 1  # as many as the streams: a lease on one node dies with that node
        self._revision: int | None = None
        self._kv: KeyValue | None = None
        self._changed = asyncio.Event()
        LEADER.labels(service, instance).set(0)

    @property
    def is_leader(self) -> bool:
        return self._revision is not None

    async def bucket(self) -> KeyValue:
        if self._kv is None:  # made by the provisioning identity where there is one, else (no auth) by us
            self._kv = await ensure_lease_bucket(self.js, ttl_s=self.ttl_s, replicas=self.replicas)
        return self._kv

    async def run(self) -> None:
        """Acquire or renew forever (cancel to stop; stop() releases the key for a fast hand-over)."""
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS blip: if we cannot renew, we must assume we lost it
                self._set(None)
                # look the bucket up again next tick: a restarted NATS has lost it (memory storage), and a handle
                # on the old one would fail forever, leaving the service without a leader
                self._kv = None
                log.warning("lease_error", extra={"service": self.service, "error": repr(exc)})
            await asyncio.sleep(self.renew_every_s)

    async def tick(self) -> None:
        kv = await self.bucket()
        if self._revision is None:
            # KeyWrongLastSequenceError here means someone else holds the lease: stay a follower this tick
            with contextlib.suppress(KeyWrongLastSequenceError):
                self._set(await kv.create(self.service, self.instance.encode()))
                log.info("lease_acquired", extra={"service": self.service, "instance": self.instance})
        else:
            try:
                self._set(await kv.update(self.service, self.instance.encode(), last=self._revision))
            except KeyWrongLastSequenceError:
                self._set(None)
                log.warning("lease_lost", extra={"service": self.service, "instance": self.instance})

    async def stop(self) -> None:
        """Give the lease up on a clean shutdown so a follower takes over now, not after the TTL."""
        if self._revision is not None and self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.purge(self.service)
        self._set(None)

    async def wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        self._changed.clear()

    def _set(self, revision: int | None) -> None:
        was = self.is_leader
        self._revision = revision
        if was != self.is_leader:
            LEADER.labels(self.service, self.instance).set(1 if self.is_leader else 0)
            self._changed.set()


async def ensure_lease_bucket(js: JetStreamContext, *, ttl_s: float = 3.0, replicas: int = 1) -> KeyValue:
    """The leases bucket, created if missing: by the provisioning identity at start where services may not."""
    try:
        return await js.key_value(LEASE_BUCKET)
    except BucketNotFoundError:
        return await js.create_key_value(KeyValueConfig(
            # on disk: a NATS restart keeps the bucket (and the leases expire as usual), where a memory bucket was
            # lost and only an identity allowed to create streams could bring it back
            bucket=LEASE_BUCKET, ttl=ttl_s, history=1, storage=StorageType.FILE, replicas=replicas,
            description="leader leases: one key per service, expiring unless renewed"))
