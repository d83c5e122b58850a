"""Writing a secret to disk: readable by its owner only from the first byte, replaced whole (never half written)."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: str | bytes, *, owner: tuple[int, int] | None = None) -> Path:
    """Write `data` to `path` with mode 0600 (owned by `owner` = (uid, gid) when given): written to a sibling
    created 0600, then renamed over `path`, so no reader ever sees it wider open or incomplete."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover sibling may have had another mode
        if owner is not None:
            os.fchown(fd, *owner)
        os.write(fd, raw)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path
