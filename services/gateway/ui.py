"""The web dashboard: static ES modules from `web/`, served by the gateway under `/ui/` with no build step.

The browser holds the API token and calls `/v1` like any other client, so these routes need no authentication and
read no data; they only hand out files that ship in the repository (works offline, no CDN). A strict
Content-Security-Policy allows only this origin's scripts, styles and API calls.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from services.gateway.problems import problem

WEB_DIR = Path(__file__).resolve().parent / "web"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
         ".json": "application/json"}
MAX_PATH = 200
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files that change with the code: always revalidate (cheap 304s via the ETag) so an upgrade is seen.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> Path | None:
    """The file under WEB_DIR for a URL path, or None (outside it, hidden, not a served type, or missing)."""
    if len(name) > MAX_PATH or any(part.startswith(".") for part in name.split("/")):
        return None
    path = (WEB_DIR / name).resolve()
    if not path.is_relative_to(WEB_DIR) or path.suffix not in TYPES or not path.is_file():
        return None
    return path


def _serve(req: Request, path: Path) -> Response:
    stat = path.stat()
    etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
    if req.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={**HEADERS, "ETag": etag})
    return FileResponse(path, media_type=TYPES[path.suffix], headers={**HEADERS, "ETag": etag})


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui")
async def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/config.json")
async def ui_config(req: Request) -> Response:
    """What the dashboard is configured with (no secret: it is served before sign-in): the job page's trace link
    template (`GPUPOOL_GATEWAY_TRACE_URL_TEMPLATE`, with `{trace_id}`), or null."""
    settings = getattr(req.app.state, "settings", None)
    body = {"trace_url_template": getattr(settings, "trace_url_template", None)}
    return JSONResponse(body, headers={**HEADERS, "Cache-Control": "no-cache"})


@router.get("/ui/{name:path}")
async def ui_file(name: str, req: Request) -> Response:
    path = _file(name or "index.html")
    if path is None:
        return problem(404, "NotFound", "no such dashboard file", instance=req.url.path)
    return _serve(req, path)
