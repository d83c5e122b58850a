"""RFC 9457 problem responses: every 4xx/5xx the gateway answers has this body (`type`, `title`, `status`,
`detail`, gpupool's machine `reason`, and what the refusal names)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

from services.gateway.domain import PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE


def problem(status: int, reason: str, detail: str, *, instance: str | None = None,
            headers: dict[str, str] | None = None, **extensions: Any) -> JSONResponse:
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
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="gpupool"'}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE, headers=headers)
