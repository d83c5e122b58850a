"""Third-party tools the ecosystem tests point at gpupool's contracts (docs/ecosystem.md).

npm tools come from ``tools/npm`` (pinned in its ``package-lock.json``), installed once with ``npm ci`` into
``tools/npm/node_modules`` (ignored by git). Debian tools (``promtool``) come from ``.ci/run``'s apt line.
Where a tool cannot be had the test skips with the reason, except under ``CI=true``, where a missing tool fails:
CI must run every ecosystem check.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NPM_DIR = ROOT / "tools" / "npm"
_STAMP = NPM_DIR / "node_modules" / ".gpupool-lock"


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"ecosystem tool unavailable in CI: {why}")
    pytest.skip(why)


def npm_tools() -> Path:
    """The folder whose ``node_modules`` holds the pinned npm tools; installs them on first use."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        _unavailable("node/npm not found: the npm ecosystem tools cannot run")
    lock = (NPM_DIR / "package-lock.json").read_bytes()
    with open(NPM_DIR / ".install-lock", "w") as guard:  # several pytest processes may ask at once
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not _STAMP.exists() or _STAMP.read_bytes() != lock:
            done = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                cwd=NPM_DIR, capture_output=True, text=True, timeout=600,
            )
            if done.returncode != 0:
                _unavailable(f"npm ci in tools/npm failed: {done.stderr[-2000:]}")
            _STAMP.write_bytes(lock)
    return NPM_DIR


def npm_bin(name: str) -> str:
    """Path of an npm tool's executable (``redocly`` …)."""
    path = npm_tools() / "node_modules" / ".bin" / name
    if not path.exists():
        _unavailable(f"{name} is not among tools/npm's packages")
    return str(path)


def debian_tool(name: str) -> str:
    """Path of a tool from Debian's packages (installed by .ci/run), e.g. ``promtool``."""
    path = shutil.which(name)
    if path is None:
        _unavailable(f"{name} not found (apt-get install the Debian package that ships it; .ci/run does)")
    return path
