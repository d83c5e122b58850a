"""The dashboard's job page links a job's trace through a configured template (GPUPOOL_GATEWAY_TRACE_URL_TEMPLATE),
served before sign-in as /ui/config.json; a template without `{trace_id}` is refused at start."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from services.gateway.bootstrap import create_app
from services.gateway.config import GatewaySettings

TEMPLATE = "https://grafana.example/explore?left=%7B%22queries%22:%5B%7B%22query%22:%22{trace_id}%22%7D%5D%7D"


async def _config(settings: GatewaySettings) -> httpx.Response:
    app = create_app(settings)
    app.state.settings = settings
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        return await http.get("/ui/config.json")


async def test_the_dashboard_reads_the_trace_link_template_without_a_token() -> None:
    response = await _config(GatewaySettings(environment="dev", trace_url_template=TEMPLATE))
    assert response.status_code == 200
    assert response.json() == {"trace_url_template": TEMPLATE}
    assert "default-src 'none'" in response.headers["content-security-policy"]


async def test_without_a_template_the_page_shows_the_bare_trace_id() -> None:
    response = await _config(GatewaySettings(environment="dev"))
    assert response.json() == {"trace_url_template": None}


def test_a_template_that_cannot_hold_the_trace_id_is_refused() -> None:
    with pytest.raises(ValidationError):
        GatewaySettings(environment="dev", trace_url_template="https://grafana.example/explore")


def test_the_job_page_builds_the_link_only_from_an_http_template_and_a_trace_id() -> None:
    """services/gateway/web/js/model.js `traceUrl`, run by node (the dashboard has no build step to test it in)."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    node = shutil.which("node")
    if node is None:
        pytest.skip("node not found")
    model = Path(__file__).resolve().parents[3] / "services" / "gateway" / "web" / "js" / "model.js"
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    cases = [[TEMPLATE, trace_id], ["http://jaeger:16686/trace/{trace_id}", trace_id], [None, trace_id],
             ["javascript:alert('{trace_id}')", trace_id], [TEMPLATE, "not-a-trace-id"], [TEMPLATE, None]]
    script = (f"import({json.dumps(model.as_uri())}).then((m) => console.log(JSON.stringify("
              f"{json.dumps(cases)}.map(([t, id]) => m.traceUrl(t, id)))))")
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=30, check=True).stdout
    assert json.loads(out) == [TEMPLATE.replace("{trace_id}", trace_id), f"http://jaeger:16686/trace/{trace_id}",
                               None, None, None, None]
