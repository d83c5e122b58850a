"""How the executor starts a shim: forked by a fork server, or spawned as a fresh interpreter.

A shim is a Python process per attempt. Spawned fresh (`python -S -P -c ...`), the interpreter's start and the
shim's imports are most of a launch's CPU (~20 ms of ~26 here). The fork server (`shim.serve`) is one interpreter
per executor, started at the first launch, that forks each shim instead: the same fds, session and code, for the
cost of a fork. A server found dead when a request bounces (killed a moment before, it can still look alive) is
replaced at once by a second try; when the server cannot be used (it did not start, or answered nonsense), the
shim is spawned as before, and after `MAX_FAILURES` failures in a row the executor stops trying the server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

log = logging.getLogger(__name__)

SHIM_MAIN = "import sys; from services.agent.executor.shim import main; sys.exit(main(sys.argv))"
SERVE_MAIN = "import sys; from services.agent.executor.shim import serve; sys.exit(serve(3))"
REPLY_TIMEOUT_S = 10.0
MAX_FAILURES = 3


class ServerUnanswered(Exception):
    """The request reached the fork server and no pid came back: a shim may or may not have been forked."""


def _argv(python: str, main: str, *args: str) -> list[str]:
    # -c, not -m: runpy alone costs ~8 ms of CPU; -S: no site-packages; -P: nothing from the cwd
    return [python, "-S", "-P", "-c", main, *args]


def spawn_shim(python: str, env: dict[str, str], attempt_dir: str, shim_log: str, report_fd: int) -> int:
    """Start the shim as a fresh interpreter in its own session (it and the work outlive the agent); the report
    pipe becomes its fd 3."""
    return os.posix_spawn(python, _argv(python, SHIM_MAIN, attempt_dir, "3"), env, setsid=True, file_actions=[
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, shim_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640),
        (os.POSIX_SPAWN_DUP2, 1, 2), (os.POSIX_SPAWN_DUP2, report_fd, 3)])


class ShimStarter:
    """Starts shims through the fork server when it can, spawned otherwise. One request at a time (a fork takes
    a millisecond); `close()` ends the server (the shims it forked go on)."""

    def __init__(self, python: str, env: dict[str, str], server_log: str, *, use_server: bool = True) -> None:
        self._python, self._env, self._server_log = python, env, server_log
        self._sock: socket.socket | None = None
        self._server_pid: int | None = None
        self._failures = 0 if use_server else MAX_FAILURES
        self._lock = asyncio.Lock()

    @property
    def server_pid(self) -> int | None:
        return self._server_pid

    async def start(self, attempt_dir: str, shim_log: str, report_fd: int) -> int:
        """The new shim's pid. OSError when neither way could start it; ServerUnanswered when the server took
        the request and did not answer (the caller must treat the launch as failed: a shim may exist)."""
        async with self._lock:
            # two tries: a server killed a moment ago can still look alive and is only found dead when the
            # request bounces; the second try starts its replacement
            for _try in range(2):
                if self._failures >= MAX_FAILURES:
                    break
                try:
                    pid = await self._fork(attempt_dir, shim_log, report_fd)
                    self._failures = 0
                    return pid
                except ServerUnanswered:
                    self._broken("did not answer")
                    raise
                except OSError as e:  # not taken: trying again or spawning cannot start a second shim
                    self._broken(str(e))
            return spawn_shim(self._python, self._env, attempt_dir, shim_log, report_fd)

    async def _fork(self, attempt_dir: str, shim_log: str, report_fd: int) -> int:
        sock = self._server()
        log_fd = os.open(shim_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        try:
            socket.send_fds(sock, [os.fsencode(attempt_dir)], [report_fd, log_fd])
        finally:
            os.close(log_fd)
        loop = asyncio.get_running_loop()
        try:
            reply = await asyncio.wait_for(loop.sock_recv(sock, 256), REPLY_TIMEOUT_S)
        except ConnectionResetError as e:
            # the server closed with our request still unread (it died before taking it): nothing was forked,
            # so spawning instead cannot start a second shim
            raise OSError(f"fork server gone before it took the request ({e})") from e
        except (TimeoutError, OSError) as e:
            raise ServerUnanswered(str(e) or type(e).__name__) from e
        text = reply.decode(errors="replace")
        if text.startswith("E "):  # refused before forking: nothing started
            raise OSError(f"fork server: {text[2:]}")
        if not text.isdigit():  # closed (it died) or garbled after taking the request: a shim may exist
            raise ServerUnanswered(f"fork server answered {text!r}")
        return int(text)

    def _server(self) -> socket.socket:
        if self._sock is not None and self._server_pid is not None and _alive(self._server_pid):
            return self._sock
        self._stop_server()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._server_pid = os.posix_spawn(
                self._python, _argv(self._python, SERVE_MAIN), self._env, setsid=True, file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, self._server_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640),
                    (os.POSIX_SPAWN_DUP2, 1, 2), (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3)])
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        return ours

    def _broken(self, why: str) -> None:
        self._failures += 1
        log.warning("shim fork server %s (%d in a row)%s", why, self._failures,
                    "; shims are spawned from now on" if self._failures >= MAX_FAILURES else "")
        self._stop_server(kill=True)

    def _stop_server(self, kill: bool = False) -> None:
        if self._sock is not None:
            self._sock.close()  # the server exits at end of file
            self._sock = None
        pid, self._server_pid = self._server_pid, None
        if pid is None:
            return
        if kill:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_soon(pid)

    def close(self) -> None:
        self._stop_server()


def _alive(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def _reap_soon(pid: int) -> None:
    """The server exits right after its socket closes: reap it then, without blocking anyone."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None

    def reap(tries: int = 0) -> None:
        if _alive(pid) and tries < 600:
            if loop is not None and not loop.is_closed():
                loop.call_later(0.05, reap, tries + 1)
            return

    if loop is None:
        return  # no loop (the executor is being torn down outside one): the server ends and init reaps it
    reap()
