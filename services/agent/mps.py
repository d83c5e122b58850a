"""CUDA MPS on the node: one control daemon per GPU that holds fractions, owned by the agent.

A fraction's limits (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, in the grant) are only
enforced when the work runs as a client of an MPS control daemon for its GPU. The agent starts that daemon on the
first fraction granted on a GPU (`nvidia-cuda-mps-control -d` with CUDA_VISIBLE_DEVICES=<the GPU's uuid> and a pipe
and log directory of its own, so daemons of different GPUs never meet), hands the work the same pipe directory,
stops it (`quit` on its control channel) when the GPU's last fraction ended and before a whole GPU or a MIG slice
of that GPU is granted, and kills it if it does not quit. The daemon writes its pid to
`<pipe>/nvidia-cuda-mps-control.pid` (NVIDIA's MPS docs), which is how a running one is recognised, also after
the agent restarted.

Every call blocks (a subprocess and a short wait): the agent runs them in a thread. Tests drive it with a fake
control binary (tests/unit/agent/test_mps.py); scripts/device_check_mps.py runs the real one when a GPU is lent
(two fractions as clients of one daemon, each reporting through the CUDA driver whether its limits held).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from libs.runtime.processes import pid_alive

PID_FILE = "nvidia-cuda-mps-control.pid"
_UUID = re.compile(r"^[A-Za-z0-9-]{1,96}$")


class MpsError(RuntimeError):
    """The daemon could not be started (no binary, it exited, it never wrote its pid)."""


class MpsControl:
    def __init__(self, root: Path, binary: str = "nvidia-cuda-mps-control", *, start_timeout_s: float = 10.0,
                 stop_timeout_s: float = 10.0, client_uid: int | None = None) -> None:
        self.root = Path(root)
        self.binary = binary
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.client_uid = client_uid  # the work's user: it must reach the pipe directory to be a client
        # one start or stop at a time per GPU: two fractions granted together must not start two daemons
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def _lock(self, gpu_uuid: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(gpu_uuid, threading.Lock())

    @staticmethod
    def find(binary: str) -> str | None:
        """The control binary's path if this node has one (a path, or a name on PATH)."""
        if os.sep in binary:
            return binary if os.access(binary, os.X_OK) else None
        return shutil.which(binary)

    # --- where a GPU's daemon lives ---------------------------------------------------------------------------
    def dirs(self, gpu_uuid: str) -> tuple[Path, Path]:
        if not _UUID.match(gpu_uuid):
            raise ValueError(f"unsafe GPU uuid {gpu_uuid!r}")
        base = self.root / gpu_uuid
        return base / "pipe", base / "log"

    def client_env(self, gpu_uuid: str) -> dict[str, str]:
        """What a fraction's work runs with to be this GPU's daemon's client."""
        pipe, log = self.dirs(gpu_uuid)
        return {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}

    def _daemon_env(self, gpu_uuid: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
        return {**env, **self.client_env(gpu_uuid), "CUDA_VISIBLE_DEVICES": gpu_uuid}

    def pid(self, gpu_uuid: str) -> int | None:
        """The daemon's pid if one runs for this GPU."""
        pipe, _ = self.dirs(gpu_uuid)
        try:
            pid = int((pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def running(self) -> list[str]:
        """GPUs with a live daemon (found on disk: also those a previous agent started)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if _UUID.match(p.name) and self.pid(p.name) is not None)

    # --- start and stop -----------------------------------------------------------------------------------------
    def ensure(self, gpu_uuid: str) -> dict[str, str]:
        """Start the GPU's daemon unless it runs; return the client environment. Raises MpsError."""
        with self._lock(gpu_uuid):
            return self._ensure(gpu_uuid)

    def _ensure(self, gpu_uuid: str) -> dict[str, str]:
        if self.pid(gpu_uuid) is not None:
            return self.client_env(gpu_uuid)
        binary = self.find(self.binary)
        if binary is None:
            raise MpsError(f"{self.binary} not found: CUDA MPS cannot enforce this fraction's limits")
        pipe, log = self.dirs(gpu_uuid)
        for directory in (pipe, log):
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o755)
            if self.client_uid is not None and os.geteuid() == 0:
                os.chown(directory, self.client_uid, -1)  # the work, an unprivileged client, reaches the pipes
        (pipe / PID_FILE).unlink(missing_ok=True)
        # the daemon keeps what it inherits: a file, not a pipe (a pipe's reader would wait for the daemon's end)
        out_path = log / "start.out"
        with open(out_path, "wb") as out:
            done = subprocess.run([binary, "-d"], env=self._daemon_env(gpu_uuid), stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=self.start_timeout_s, check=False)
        if done.returncode != 0:
            said = out_path.read_bytes()[-300:].decode(errors="replace")
            raise MpsError(f"{binary} -d exited {done.returncode}: {said}")
        deadline = time.monotonic() + self.start_timeout_s
        while self.pid(gpu_uuid) is None:
            if time.monotonic() > deadline:
                raise MpsError(f"the MPS control daemon for {gpu_uuid} wrote no pid to {pipe / PID_FILE}")
            time.sleep(0.02)
        return self.client_env(gpu_uuid)

    def stop(self, gpu_uuid: str) -> bool:
        """Ask the GPU's daemon to quit, kill it if it has not within the timeout; True if one was running."""
        with self._lock(gpu_uuid):
            return self._stop(gpu_uuid)

    def _stop(self, gpu_uuid: str) -> bool:
        pid = self.pid(gpu_uuid)
        if pid is None:
            return False
        binary = self.find(self.binary)
        if binary is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run([binary], input=b"quit\n", env=self._daemon_env(gpu_uuid),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=self.stop_timeout_s, check=False)
        deadline = time.monotonic() + self.stop_timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pipe, _ = self.dirs(gpu_uuid)
        (pipe / PID_FILE).unlink(missing_ok=True)
        return True

    def stop_all(self) -> list[str]:
        stopped = self.running()
        for gpu in stopped:
            self.stop(gpu)
        return stopped

