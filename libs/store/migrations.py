"""Forward-only SQL migrations, applied at start under an advisory lock so concurrent starts never race.

Each service keeps `migrations/NNNN_name.sql` in its package. The shared outbox/inbox tables come first as
namespace `store`. An applied file whose text later changed is refused: history is never rewritten.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

log = logging.getLogger(__name__)

_LOCK_KEY = 0x6770_7570  # "gpup": one advisory lock id for migrations in any gpupool database


@dataclass(frozen=True, slots=True)
class Migration:
    namespace: str
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    pass


def load_migrations(namespace: str, folder: Path) -> list[Migration]:
    out = []
    for path in sorted(folder.glob("*.sql")):
        stem = path.stem
        head, _, name = stem.partition("_")
        if not head.isdigit():
            raise MigrationError(f"migration file {path.name} must start with a number, e.g. 0001_init.sql")
        out.append(Migration(namespace, int(head), name, path.read_text()))
    versions = [m.version for m in out]
    if len(versions) != len(set(versions)):
        raise MigrationError(f"duplicate migration numbers in {folder}")
    return out


def package_migrations(namespace: str, package: str) -> list[Migration]:
    return load_migrations(namespace, Path(str(resources.files(package).joinpath("migrations"))))


def store_migrations() -> list[Migration]:
    return package_migrations("store", "libs.store")


async def migrate(pool: asyncpg.Pool, migrations: list[Migration]) -> list[Migration]:
    """Apply what is missing, each file in its own transaction; return what was applied."""
    applied_now: list[Migration] = []
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                       namespace TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL,
                       checksum TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                       PRIMARY KEY (namespace, version))"""
            )
            rows = await conn.fetch("SELECT namespace, version, checksum FROM schema_migrations")
            done = {(r["namespace"], r["version"]): r["checksum"] for r in rows}
            for m in migrations:
                key = (m.namespace, m.version)
                if key in done:
                    if done[key] != m.checksum:
                        raise MigrationError(
                            f"migration {m.namespace}/{m.version:04d}_{m.name} changed after it was applied; "
                            "add a new migration instead of editing an old one")
                    continue
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (namespace, version, name, checksum) VALUES ($1,$2,$3,$4)",
                        m.namespace, m.version, m.name, m.checksum)
                log.info("migration_applied", extra={"namespace": m.namespace, "version": m.version,
                                                     "migration": m.name})
                applied_now.append(m)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    return applied_now
