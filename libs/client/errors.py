"""The client's errors: every failure is a `GpupoolError` (the gateway's RFC 9457 problem parsed, or status 0 when
the gateway was not reached); and the path-segment escape every call uses."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import httpx


class GpupoolError(Exception):
    """An API call failed. `status` is the HTTP status (0: the gateway was not reached), `reason` the gateway's
    machine reason (CamelCase, e.g. UnknownTeam), `detail` the human text, `problem` the whole problem body,
    `retry_after_s` the seconds of a `Retry-After` header (e.g. 429 QueueFull: the queue is full for now)."""

    def __init__(self, status: int, reason: str, detail: str, problem: dict[str, Any] | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail
        self.problem: dict[str, Any] = problem if problem is not None else {}
        self.retry_after_s = retry_after_s  # the gateway's Retry-After (a 429 QueueFull, a 503), when it sent one

    @property
    def unreachable(self) -> bool:
        """The gateway was not reached at all (refused, DNS, timeout)."""
        return self.reason == "Unreachable"

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" + (f" (HTTP {self.status})" if self.status else "")

    def __repr__(self) -> str:
        return f"GpupoolError({self.status}, {self.reason!r}, {self.detail!r})"


class ConfigError(GpupoolError):
    """No gateway URL or token could be found (flags, environment, run.json)."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, "NotConfigured", detail)


def _camel(phrase: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in phrase.replace("-", " ").split())


def error_from_response(resp: httpx.Response) -> GpupoolError:
    """Turn an error response into a GpupoolError: the problem+json body when there is one, else something
    readable built from the status line and the start of the body (a proxy's HTML page, say)."""
    try:
        phrase = HTTPStatus(resp.status_code).phrase
    except ValueError:
        phrase = "HTTP Error"
    body: Any = None
    try:
        body = resp.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        reason = body.get("reason") or _camel(str(body.get("title") or phrase))
        detail = body.get("detail")
        if detail is None:
            detail = body.get("title") or body.get("message") or phrase
        if not isinstance(detail, str):
            detail = json.dumps(detail)
        return GpupoolError(resp.status_code, str(reason), detail, body, retry_after(resp))
    text = " ".join(resp.text.split())[:200] if resp.content else ""
    return GpupoolError(resp.status_code, _camel(phrase), text or phrase, {}, retry_after(resp))


def retry_after(resp: httpx.Response) -> float | None:
    """A `Retry-After` in seconds (the form the gateway sends); None when absent or an HTTP date."""
    value = resp.headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def _seg(value: str) -> str:
    """One path segment, escaped, so an id can never walk to another route."""
    from urllib.parse import quote

    return quote(str(value), safe="")
