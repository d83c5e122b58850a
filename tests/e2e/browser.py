"""Headless Debian Chromium driven by Playwright for the dashboard tests. Playwright's own browser download is never
used (no `playwright install`): the system's /usr/bin/chromium, a fresh profile per module, no network beyond the
page's own origin."""

from __future__ import annotations

import os
import platform as host
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1440, "height": 900}


def require_browser() -> None:
    """Skip only when asked to (GPUPOOL_SKIP_BROWSER=1); a missing browser is a failure, never a silent pass."""
    if os.environ.get("GPUPOOL_SKIP_BROWSER") == "1":
        pytest.skip("browser tests skipped: GPUPOOL_SKIP_BROWSER=1")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"the dashboard tests need Chromium at {CHROMIUM}: install it with `apt-get install -y chromium` "
                    "(.ci/run does), or set GPUPOOL_SKIP_BROWSER=1 to skip them", pytrace=False)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("the dashboard tests need the `playwright` package (the test extra: pip install -e '.[test]'); "
                    "never run `playwright install`: they use Debian's Chromium", pytrace=False)


@contextmanager
def chromium(profile: Path) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=ARGS, viewport=VIEWPORT,
            accept_downloads=True, device_scale_factor=1, locale="en-GB", timezone_id="UTC")
        try:
            yield context
        finally:
            context.close()


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        version = "Chromium (version unknown)"
    return (f"{cpu}; {os.cpu_count()} logical CPUs; {version.splitlines()[0] if version else 'Chromium'} headless "
            f"(software rendering, --disable-gpu); Python {host.python_version()}; {host.system()} {host.release()}")
