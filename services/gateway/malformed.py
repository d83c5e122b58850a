"""Requests too malformed to reach the app (bad request line, bad header) are answered by the HTTP server itself:
uvicorn's answer is a plain-text 400. This protocol answers them as every other error of the API, with an RFC 9457
problem body, and closes the connection as uvicorn does."""

from __future__ import annotations

import json
from typing import Any

from services.gateway.domain import PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE


def problem_400(detail: str) -> bytes:
    body = json.dumps({"type": PROBLEM_TYPE_BASE + "MalformedRequest", "title": "Bad Request", "status": 400,
                       "detail": detail, "reason": "MalformedRequest"}).encode()
    head = (f"HTTP/1.1 400 Bad Request\r\ncontent-type: {PROBLEM_CONTENT_TYPE}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def protocol_class() -> type[Any]:
    """uvicorn's fastest HTTP/1.1 protocol here (httptools where installed, else h11), answering 400s as
    problems."""
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class ProblemProtocol(Base):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            self.transport.write(problem_400(msg))
            self.transport.close()

    return ProblemProtocol
