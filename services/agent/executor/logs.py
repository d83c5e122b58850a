"""Size-bounded job logs: the shim writes them (`RotatingLog`), the executor reads them (`read_log`).

Per stream two files, each at most `max_bytes`: `stdout.log` (being written) and `stdout.log.1` (the one before).
Offsets count bytes since the attempt started and survive rotation: `stdout.log.idx` holds `base`, the offset of
the first byte of `stdout.log`, and a generation number the writer makes odd while it rotates and even after (a
seqlock: a reader that sees an odd or changed generation reads again). Standard library only, and neither `json`
nor `contextlib` on the writer's side: this module is on the shim's start path (`dumps` is its JSON)."""

from __future__ import annotations

import os
import time

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " " or "\ud800" <= ch <= "\udfff":  # control characters; lone surrogates
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def dumps(value: object) -> str:
    """JSON of plain data (dicts with str keys, lists, tuples, str, int, float, bool, None), as `json.dumps` writes
    it; what the shim writes without importing `json` (and `re`) on every job's start path."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not JSON")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_string(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    raise TypeError(f"{type(value).__name__} is not plain data")


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class RotatingLog:
    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max(1, int(max_bytes))
        self.base = 0  # offset of stdout.log's first byte
        self.size = 0  # bytes in stdout.log
        self.gen = 0
        self.fd = self._open()
        # no index until the first rotation: a missing one reads as generation 0, base 0 (a file less per job)
        _remove(self.path + ".idx")

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o640)

    def _index(self) -> None:
        _atomic_write(self.path + ".idx", dumps({"gen": int(self.gen), "base": int(self.base)}).encode())

    @property
    def total(self) -> int:
        return self.base + self.size

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            room = self.max_bytes - self.size
            if room <= 0:
                self._rotate()
                room = self.max_bytes
            n = os.write(self.fd, view[:room])
            self.size += n
            view = view[n:]

    def _rotate(self) -> None:
        self.gen += 1
        self._index()  # odd: readers wait
        os.close(self.fd)
        os.replace(self.path, self.path + ".1")
        self.fd = self._open()
        self.base += self.size
        self.size = 0
        self.gen += 1
        self._index()

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _index(path: str) -> tuple[int, int] | None:
    """(generation, base) from the log's index; (0, 0) while it has none (never rotated); None if unreadable."""
    import json  # the reader's side (the executor): not on the shim's path

    try:
        with open(path + ".idx", "rb") as f:
            d = json.loads(f.read())
        return int(d["gen"]), int(d["base"])
    except FileNotFoundError:
        return (0, 0) if os.path.exists(path) else None
    except (OSError, ValueError, KeyError):
        return None


def _open_ro(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def log_extent(path: str) -> tuple[int, int]:
    """(oldest retained offset, end offset) of a log."""
    data, start, _end = _segments(path)
    for fd, _b, _s in data:
        os.close(fd)
    return start, _end


def _segments(path: str) -> tuple[list[tuple[int, int, int]], int, int]:
    """Open, consistently, the retained files: ([(fd, base offset, size)] oldest first, oldest offset, end)."""
    for _ in range(1000):
        first = _index(path)
        if first is None:
            return [], 0, 0
        if first[0] % 2:
            time.sleep(0.001)
            continue
        cur, old = _open_ro(path), _open_ro(path + ".1")
        if _index(path) != first:
            for fd in (cur, old):
                if fd is not None:
                    os.close(fd)
            continue
        base = first[1]
        out = []
        if old is not None:
            size = os.fstat(old).st_size
            out.append((old, base - size, size))
        if cur is not None:
            out.append((cur, base, os.fstat(cur).st_size))
        start = out[0][1] if out else base
        end = out[-1][1] + out[-1][2] if out else base
        return out, start, end
    raise OSError(f"log {path} kept rotating while being read")


def read_log(path: str, offset: int = 0, limit: int = 65536, tail: int | None = None) -> tuple[bytes, int, int]:
    """Bytes from `offset` (an offset that was rotated away starts at the oldest retained byte), at most `limit`;
    with `tail` the last `tail` bytes instead. Returns (data, next_offset, end offset)."""
    segments, start, end = _segments(path)
    try:
        if tail is not None:
            offset, limit = max(start, end - max(0, tail)), max(0, tail)
        offset = min(max(offset, start), end)
        want = max(0, min(limit, end - offset))
        chunks, pos = [], offset
        for fd, base, size in segments:
            if want <= 0:
                break
            if pos >= base + size:
                continue
            n = min(want, base + size - pos)
            chunk = os.pread(fd, n, pos - base)
            chunks.append(chunk)
            pos += len(chunk)
            want -= len(chunk)
            if len(chunk) < n:
                break
        return b"".join(chunks), pos, end
    finally:
        for fd, _b, _s in segments:
            os.close(fd)
