"""RFC 9457 problem details: every error the gateway returns has this shape, with a machine `reason`."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

PROBLEM_TYPE_BASE = "https://gpupool.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"


def problem(status: int, reason: str, detail: str, *, instance: str | None = None,
            **extensions: Any) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + reason,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "reason": reason,
    }
    if instance:
        body["instance"] = instance
    body.update({k: v for k, v in extensions.items() if v not in (None, {}, [])})
    headers = {"WWW-Authenticate": 'Bearer realm="gpupool"'} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE, headers=headers)
