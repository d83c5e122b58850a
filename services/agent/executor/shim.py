"""The per-attempt supervisor (what slurmstepd or conmon is): `python -S -m services.agent.executor.shim ATTEMPT_DIR
[REPORT_FD]`.

The executor starts it in its own session, so that it and the work survive the agent (a `kill -9` of the agent
leaves both running; the next agent re-adopts them from its records). It reads `ATTEMPT_DIR/plan.marshal` (the
executor's `plan`: what to exec, as whom, where, in which cgroup; the record holds the spec), then:

1. forks the work; the child makes itself a session leader, joins the job cgroup in every hierarchy (writing its
   own pid, while still root), clears supplementary groups, sets gid and uid, chdirs and execs — a failure at any
   step comes back over a close-on-exec pipe as (stage, errno), so "the command does not exist" is told apart
   from "it ran and failed";
2. says so to the executor — one JSON line on REPORT_FD and the file `started` — once the work has really
   started: at the exec, or for a launcher (bwrap, podman) once a process of the cgroup is no longer the launcher;
   a launcher that fails before that (its own stderr marker, e.g. "bwrap: ...") is a launch failure;
3. copies the work's stdout and stderr into size-bounded rotated logs (`logs.RotatingLog`);
4. is the subreaper of the work's tree (orphans are re-parented to it and reaped); when the work's main process
   exits it kills whatever is left in the cgroup and waits until the cgroup is empty;
5. writes `status.json` atomically (exit code or signal, rusage, times, OOM events, log sizes) and exits.

Standard library only, and imports little: it is on every job's start path (no json, re, contextlib, selectors:
each costs milliseconds of CPU per job; `logs.dumps` writes its JSON).
"""

from __future__ import annotations

import marshal
import os
import resource
import select
import sys
import time

try:  # the C module: `signal` builds enums, milliseconds of every job's start
    import _signal as signal
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]

from services.agent.executor import cgroups
from services.agent.executor.logs import RotatingLog, _atomic_write, dumps

PR_SET_CHILD_SUBREAPER = 36
_HEAD = 4096  # bytes of the launcher's stderr kept to recognise its setup failures


def _json_write(path: str, data: dict) -> None:
    _atomic_write(path, dumps(data).encode())


def _subreaper() -> None:
    """prctl(PR_SET_CHILD_SUBREAPER): the work's orphans are re-parented to the shim, which reaps them. Through
    `_ctypes`' own call, not `ctypes` (whose import is ~4 ms of CPU on every job's start)."""
    try:
        import _ctypes

        _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"), (PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
        return
    except (ImportError, AttributeError, OSError):
        pass
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child(plan: dict, out_w: int, err_w: int, ex_w: int) -> None:
    """In the forked child: become the work, or report why not over ex_w. Never returns."""
    stage = "setsid"
    try:
        os.setsid()
        stage = "cgroup"
        pid = str(os.getpid())
        for path in plan["cgroup_procs"]:
            with open(path, "w") as f:
                f.write(pid)
        stage = "stdio"
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, ex_w)
        os.closerange(ex_w + 1, 1 << 16)
        signal.set_wakeup_fd(-1)
        for sig in range(1, signal.NSIG):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        stage = "credentials"
        if plan.get("uid") is not None:
            os.setgroups([])
            os.setgid(plan["gid"])
            os.setuid(plan["uid"])
        stage = "chdir"
        os.chdir(plan["cwd"])
        os.umask(0o022)
        stage = "exec"
        os.execve(plan["path"], plan["argv"], plan["env"])
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent
        try:
            os.write(ex_w, marshal.dumps({"stage": stage, "errno": getattr(e, "errno", None) or 0,
                                          "message": f"{stage}: {e}"}))
        except OSError:
            pass
    finally:
        os._exit(127)


_ALIASES = ("SIGIOT", "SIGCLD", "SIGPOLL")  # other names of SIGABRT, SIGCHLD, SIGIO


def _signal_name(number: int) -> str:
    """The name `signal.Signals(number).name` gives (SIGTERM, SIGRTMIN, ...), without the enum."""
    for name, value in vars(signal).items():
        if value == number and name.startswith("SIG") and not name.startswith("SIG_") and name not in _ALIASES \
                and isinstance(value, int):
            return name
    # a real-time signal without a name of its own
    return f"SIGRTMIN+{number - signal.SIGRTMIN}" if number > signal.SIGRTMIN else f"SIG{number}"


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class Shim:
    def __init__(self, attempt_dir: str, report_fd: int | None) -> None:
        self.dir = attempt_dir
        self.report_fd = report_fd
        with open(os.path.join(attempt_dir, "plan.marshal"), "rb") as f:
            self.plan = marshal.loads(f.read())
        self.cg = cgroups.from_descriptor(self.plan["cgroup"])
        self.launchers = tuple(self.plan.get("launchers") or ())
        self.pid = 0
        self.status: tuple[int, object] | None = None  # (wait status, rusage) of the main process
        self.started_at = 0.0
        self.announced = False
        self.oom_events = 0
        self.head = bytearray()
        self.poll = select.poll()
        self.watched: dict[int, str] = {}  # fd → "log", "oom" or "wake"
        self.logs: dict[int, RotatingLog] = {}
        self.err_fd = -1

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> bool:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ex_r, ex_w = os.pipe2(os.O_CLOEXEC)
        max_bytes = int(self.plan["log_max_bytes"])
        self.logs = {out_r: RotatingLog(os.path.join(self.dir, "stdout.log"), max_bytes),
                     err_r: RotatingLog(os.path.join(self.dir, "stderr.log"), max_bytes)}
        self.err_fd = err_r
        pid = os.fork()
        if pid == 0:
            os.close(ex_r)
            _child(self.plan, out_w, err_w, ex_w)
        self.pid = pid
        for fd in (out_w, err_w, ex_w):
            os.close(fd)
        failure = _read_all(ex_r)
        os.close(ex_r)
        if failure:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self._fail(marshal.loads(failure))
            return False
        self.started_at = time.time()
        if isinstance(self.cg, cgroups.NoCgroup):
            self.cg = cgroups.NoCgroup(pid)
        for fd in self.logs:
            os.set_blocking(fd, False)
            self._register(fd, "log")
        self._watch_oom()
        if self.plan.get("ready", "exec") == "exec" or not self.launchers:
            self._announce()
        return True

    def _watch_oom(self) -> None:
        """cgroup v1: an eventfd the kernel signals on every OOM of the job's memory cgroup (its descendants'
        kills are counted in the descendants, which a container runtime may remove before anyone reads them)."""
        memory = self.plan["cgroup"].get("dirs", {}).get("memory") if self.plan["cgroup"]["kind"] == "v1" else None
        if not memory or not hasattr(os, "eventfd"):
            return
        try:
            efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            ofd = os.open(os.path.join(memory, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
            with open(os.path.join(memory, "cgroup.event_control"), "w") as f:
                f.write(f"{efd} {ofd}")
            self._register(efd, "oom")
        except OSError:
            pass

    def _register(self, fd: int, what: str) -> None:
        self.poll.register(fd, select.POLLIN)
        self.watched[fd] = what

    def _report(self, line: dict) -> None:
        if self.report_fd is None:
            return
        try:
            os.write(self.report_fd, (dumps(line) + "\n").encode())
            os.close(self.report_fd)
        except OSError:
            pass
        self.report_fd = None

    def _announce(self) -> None:
        self.announced = True
        started = {"pid": self.pid, "shim_pid": os.getpid(), "started_at": self.started_at}
        _json_write(os.path.join(self.dir, "started"), started)
        self._report({"ok": True, **started})

    def _fail(self, failure: dict) -> None:
        for log in self.logs.values():
            log.close()
        _json_write(os.path.join(self.dir, "status.json"), {"launch_failed": failure, "pid": self.pid})
        self._report({"ok": False, **failure})

    # -- watch -----------------------------------------------------------------------------------------------
    def _pump(self, timeout: float | None) -> None:
        try:
            ready = self.poll.poll(None if timeout is None else timeout * 1000)
        except InterruptedError:
            ready = []
        for fd, _ev in ready:
            what = self.watched.get(fd)
            if what == "oom":
                try:
                    self.oom_events += int.from_bytes(os.read(fd, 8), sys.byteorder)
                except OSError:
                    pass
                continue
            if what == "wake":
                try:
                    os.read(fd, 4096)
                except OSError:
                    pass
                continue
            if what != "log":
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:  # the writers are gone (POLLHUP reads as end of file too)
                self.poll.unregister(fd)
                del self.watched[fd]
                os.close(fd)
                continue
            self.logs[fd].write(data)
            if fd == self.err_fd and len(self.head) < _HEAD:
                self.head += data[:_HEAD - len(self.head)]
        self._reap()

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = (status, usage)

    def _work_started(self) -> bool:
        return any(not cgroups.is_launcher(p, self.launchers) for p in self.cg.pids())

    def watch(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._register(wake_r, "wake")
        signal.set_wakeup_fd(wake_w)
        self._reap()
        ready_by = time.monotonic() + float(self.plan.get("ready_timeout_s", 60))
        while self.status is None:
            self._pump(None if self.announced else 0.005)
            if not self.announced and self.status is None and (self._work_started() or time.monotonic() > ready_by):
                self._announce()

    def _setup_failed(self) -> bool:
        """The launcher exited before the work started, with its own failure marker."""
        code = os.waitstatus_to_exitcode(self.status[0])
        return any(code in marker["codes"] and bytes(self.head).startswith(marker["stderr_prefix"].encode())
                   for marker in self.plan.get("setup_failure") or ())

    # -- end -------------------------------------------------------------------------------------------------
    def finish(self) -> None:
        exited_at = time.time()
        if not self.announced and self._setup_failed():
            self._empty()
            self._drain(1.0)
            self._fail({"stage": "setup", "errno": 0, "exit_code": os.waitstatus_to_exitcode(self.status[0]),
                        "message": bytes(self.head).decode(errors="replace").strip()})
            return
        if not self.announced:
            self._announce()
        emptied = self._empty()
        self._drain(2.0)
        self._reap()
        status, usage = self.status
        code = os.waitstatus_to_exitcode(status)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = {
            "pid": self.pid, "exit_code": code if code >= 0 else None,
            "signal": _signal_name(-code) if code < 0 else None, "core_dumped": os.WCOREDUMP(status),
            "started_at": self.started_at, "exited_at": exited_at,
            "rusage": {"utime": usage.ru_utime, "stime": usage.ru_stime, "maxrss_kib": usage.ru_maxrss},
            "children_cpu_s": children.ru_utime + children.ru_stime,
            "oom_events": self.oom_events, "cgroup_emptied": emptied,
            "log_bytes": {"stdout": self._log("stdout").total, "stderr": self._log("stderr").total},
        }
        for log in self.logs.values():
            log.close()
        _json_write(os.path.join(self.dir, "status.json"), out)

    def _log(self, stream: str) -> RotatingLog:
        return next(log for log in self.logs.values() if log.path.endswith(f"{stream}.log"))

    def _empty(self) -> bool:
        """Kill what is left of the work until the cgroup is empty (bounded; the executor goes on after)."""
        end = time.monotonic() + float(self.plan.get("empty_timeout_s", 30))
        for delay in cgroups.emptying(self.cg, self.launchers):
            self._pump(0)
            if time.monotonic() > end:
                return False
            time.sleep(delay)
        return True

    def _drain(self, timeout: float) -> None:
        """Read the pipes to their end: every writer is dead once the cgroup is empty (outside cgroups a process
        that left the session may still hold them, hence the bound)."""
        end = time.monotonic() + timeout
        while any(what == "log" for what in self.watched.values()) and time.monotonic() < end:
            self._pump(0.05)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m services.agent.executor.shim ATTEMPT_DIR [REPORT_FD]", file=sys.stderr)
        return 2
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # only the executor's SIGKILL (or the machine) ends a shim
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through the wakeup fd
    _subreaper()
    shim = Shim(argv[1], int(argv[2]) if len(argv) > 2 else None)
    if not shim.start():
        return 0
    shim.watch()
    shim.finish()
    return 0


def _reap_children(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_shim(attempt_dir: str, report_fd: int, log_fd: int) -> int:
    """In a child of the fork server: the fds a spawned shim would have (stdin /dev/null, stdout and stderr the
    shim log, the report pipe as fd 3, nothing else), its own session, then the shim."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.dup2(report_fd, 3)
    os.closerange(4, 1 << 16)
    return main(["shim", attempt_dir, "3"])


def serve(sock_fd: int) -> int:
    """The executor's fork server: `python -S -P -c "...shim import serve..."` with a SOCK_SEQPACKET socket as
    `sock_fd`. Each request is an attempt dir with two fds (the report pipe's write end, the open shim log); the
    server forks, the child becomes that attempt's shim (`_become_shim`) and the reply is its pid (`"<pid>"`, or
    `"E <why>"`). Paying the interpreter's start and these imports once per executor instead of once per job is
    most of a launch's CPU. It reaps the shims it forked (they are its children until it ends, then init's, as a
    spawned shim is the agent's) and exits when the executor's end of the socket closes."""
    import socket

    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGCHLD, _reap_children)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for `gpupool up`: the executor closes us
    try:
        import _ctypes  # noqa: F401 - the shims' subreaper call, imported once here
    except ImportError:
        pass
    while True:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 8192, 2)
        if not msg:
            return 0
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            sock.sendall(b"E a request carries the report pipe and the shim log")
            continue
        report_fd, log_fd = fds
        try:
            pid = os.fork()
        except OSError as e:
            pid = -1
            sock.sendall(f"E fork: {e}".encode())
        if pid == 0:
            code = 127
            try:
                sock.close()
                code = _become_shim(os.fsdecode(msg), report_fd, log_fd)
            except BaseException as e:  # noqa: BLE001 - the child must never return into the server's loop
                try:
                    os.write(2, f"shim: {e!r}\n".encode())
                except OSError:
                    pass
            finally:
                os._exit(code)
        os.close(report_fd)
        os.close(log_fd)
        if pid > 0:
            sock.sendall(str(pid).encode())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
