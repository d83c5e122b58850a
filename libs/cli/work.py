"""`gpupool submit`, `gpupool run`, `gpupool logs`: jobs that run a command on their GPUs, and what they write.

  gpupool submit [flags] [-f job.yaml] [-- CMD ARGS...]   queue a job; with a command the node's agent runs it
  gpupool run [flags] [-f job.yaml] -- CMD ARGS...        submit, wait, stream its output, exit with its exit code
  gpupool logs [-f] [--replica N] [--attempt N] [--stream S] [--tail N] JOB_ID

Everything after `--` is the command's argv (no shell: write `-- sh -c '...'` for one). The work flags (--env,
--workdir, --cpu-milli, --memory-mib, --pids, --stop-signal, --stop-grace, --warn-before, --warn-signal, --restart,
--isolation, --image, --rootfs) and the YAML keys of the same names (those of the HTTP body) need a command.

`gpupool run` exits with the work's status: its exit code; 0 when the job completed; 128 + the signal's number when
it was killed by one (137 when out of memory); 130 when our Ctrl-C cancelled it; 1 for any other failure or
cancellation. Its own status lines go to stderr (`--quiet`: none), so stdout carries only the work's stdout.
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from libs.cli.common import EXIT_OK, JOB_KINDS, PRIORITY_CLASSES, UsageError, parse_duration
from libs.cli.jobs import job_shape
from libs.cli.render import emit, fmt_duration
from libs.cli.spec import load_spec_file, merge_spec, parse_mib
from libs.client import GpupoolClient, GpupoolError
from libs.client.models import Job

SIGNALS = ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGKILL")
ISOLATIONS = ("process", "sandbox", "container")
LOG_STREAMS = ("stdout", "stderr", "both")
WAITING = ("awaiting_approval", "pending", "launching")
NAME_CHARS = re.compile(r"[^a-z0-9._-]+")
POLL_S = 0.5  # `gpupool run` asks for the job's state at most this far apart while it waits
FIRST_POLL_S = 0.05  # ... and first this soon: a job that starts (or ends) at once is seen at once

# YAML keys of the work (the HTTP body's, plus the dashed spellings the shape keys also accept)
WORK_KEYS = {"command": "command", "env": "env", "workdir": "workdir", "limits": "limits",
             "stop_signal": "stop_signal", "stop-signal": "stop_signal",
             "stop_grace_s": "stop_grace_s", "stop_grace": "stop_grace_s", "stop-grace": "stop_grace_s",
             "warn_before_s": "warn_before_s", "warn_before": "warn_before_s", "warn-before": "warn_before_s",
             "warn_signal": "warn_signal", "warn-signal": "warn_signal", "restart": "restart",
             "isolation": "isolation", "image": "image", "rootfs": "rootfs", "ports": "ports", "health": "health"}
LIMIT_KEYS = ("cpu_milli", "memory_mib", "pids")


# --- the work part of a job spec: YAML file + flags -----------------------------------------------------------------
def split_spec(file_doc: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """A job file's shape and queue fields (for spec.merge_spec) apart from its work fields."""
    if file_doc is None:
        return None, {}
    shape = {k: v for k, v in file_doc.items() if str(k) not in WORK_KEYS}
    work = {WORK_KEYS[str(k)]: v for k, v in file_doc.items() if str(k) in WORK_KEYS}
    return shape, work


def parse_env(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--env expects NAME=VALUE, not {item!r}")
        out[name] = value
    return out


def parse_restart(value: Any) -> dict[str, Any]:
    """`never`, `on_failure:N` or `on_failure:N:DELAY` (DELAY seconds or e.g. 30s, 2m); a YAML mapping as is."""
    if isinstance(value, dict):
        return dict(value)
    text = str(value).strip()
    policy, _, rest = text.partition(":")
    policy = policy.replace("-", "_")
    if policy == "never" and not rest:
        return {"policy": "never"}
    attempts, _, delay = rest.partition(":")
    if policy != "on_failure" or not attempts.isdigit() or int(attempts) < 1:
        raise UsageError(f"restart must be never, on_failure:N or on_failure:N:DELAY (N ≥ 1), not {text!r}")
    out: dict[str, Any] = {"policy": "on_failure", "attempts": int(attempts)}
    if delay:
        out["delay_s"] = parse_duration(delay)
    return out


def _argv(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str | int | float) for a in value):
        raise UsageError('command must be a list of arguments (argv), e.g. ["sh", "-c", "echo hi"]')
    return [str(a) for a in value]


def _limits(file_value: Any, flags: dict[str, Any]) -> dict[str, int]:
    if file_value is None:
        file_value = {}
    if not isinstance(file_value, dict) or any(k not in LIMIT_KEYS for k in file_value):
        raise UsageError(f"limits must be a mapping of {', '.join(LIMIT_KEYS)}")
    merged = {**file_value, **{k: v for k, v in flags.items() if v is not None}}
    out: dict[str, int] = {}
    for key, value in merged.items():
        if value is None:
            continue
        if key == "memory_mib":
            out[key] = parse_mib(value)
        elif isinstance(value, bool) or not str(value).strip().isdigit():
            raise UsageError(f"{key} must be a whole number, not {value!r}")
        else:
            out[key] = int(value)
    return out


def merge_work(file_work: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The work fields of the body: the file's, then every flag given on top (`env` and `limits` merge key by
    key). Wrong types are usage errors; the gateway checks the rest (env names, paths, container rules)."""
    work: dict[str, Any] = {}
    if flags.get("command") or file_work.get("command") is not None:
        work["command"] = _argv(flags.get("command") or file_work.get("command"))
    env = file_work.get("env") or {}
    if not isinstance(env, dict):
        raise UsageError("env must be a mapping of NAME: value")
    env = {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}
    env.update(parse_env(flags.get("env")))
    if env:
        work["env"] = env
    limits = _limits(file_work.get("limits"), {k: flags.get(k) for k in LIMIT_KEYS})
    if limits:
        work["limits"] = limits
    restart = flags.get("restart") or file_work.get("restart")
    if restart is not None:
        work["restart"] = parse_restart(restart)
    for key in ("stop_grace_s", "warn_before_s"):
        value = flags.get(key) if flags.get(key) is not None else file_work.get(key)
        if value is not None:
            work[key] = parse_duration(value)
    for key in ("workdir", "stop_signal", "warn_signal", "isolation", "image", "rootfs"):
        value = flags.get(key) if flags.get(key) is not None else file_work.get(key)
        if value is not None:
            work[key] = str(value)
    ports = file_work.get("ports")
    if ports is not None:
        if not isinstance(ports, list) or not all(isinstance(p, str) for p in ports):
            raise UsageError("ports must be a list of names, e.g. [http, metrics]")
        work["ports"] = ports
    health = file_work.get("health")
    if health is not None:
        if not isinstance(health, dict):
            raise UsageError("health must be a mapping: {http: /healthz} or {tcp: PORT} or {exec: [argv]}, with "
                             "interval_s, timeout_s, grace_s, failures")
        work["health"] = health
    return work


def shape_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {"name": args.name, "team": args.team, "project": args.project, "gpus": args.gpus,
            "gpu_models": args.models, "kind": args.kind, "priority_class": args.priority_class,
            "idempotency_key": args.idempotency_key, "gang_nodes": args.gang_nodes,
            "gpus_per_node": args.gpus_per_node, "replicas": args.replicas, "max_runtime_s": args.max_runtime,
            "gpu_fraction_milli": args.fraction, "gpu_memory_mib": args.gpu_memory, "mig_profile": args.mig,
            "exclusive": True if args.exclusive else None, "cpu": args.cpu, "memory_mib": args.memory,
            "node_selector": args.selector, "preemptible": args.preemptible}


def work_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {"command": args.command or None, "env": args.env, "workdir": args.workdir, "cpu_milli": args.cpu_milli,
            "memory_mib": args.memory_mib, "pids": args.pids, "stop_signal": args.stop_signal,
            "stop_grace_s": args.stop_grace, "warn_before_s": args.warn_before, "warn_signal": args.warn_signal,
            "restart": args.restart, "isolation": args.isolation, "image": args.image, "rootfs": args.rootfs}


def default_name(command: list[str]) -> str:
    """A job name from the program: `python train.py` → run-python."""
    program = command[0].rstrip("/").rsplit("/", 1)[-1].lower()
    stem = NAME_CHARS.sub("-", program).strip("._-")[:50].strip("._-")
    return f"run-{stem}" if stem else "run"


def job_request(args: argparse.Namespace, *, run: bool = False,
                team_of_token: Callable[[], str | None] = lambda: None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(shape and queue fields, work fields) of a submission from the -f file and the flags. For `run`, a name
    from the command, the token's team, one GPU and a command are the defaults and the requirement."""
    file_doc = load_spec_file(args.file) if args.file else None
    file_shape, file_work = split_spec(file_doc)
    work = merge_work(file_work, work_flags(args))
    flags = shape_flags(args)
    if run:
        if "command" not in work:
            raise UsageError("gpupool run needs the command after --, e.g. gpupool run -- python train.py")
        given = {**(file_shape or {}), **{k: v for k, v in flags.items() if v is not None}}
        if "name" not in given:
            flags["name"] = default_name(work["command"])
        if "team" not in given:
            flags["team"] = team_of_token()
            if not flags["team"]:
                raise UsageError("missing --team (the token is not bound to a team)")
        share = any(k in given for k in ("gang_nodes", "gang-nodes", "fraction", "gpu_fraction_milli", "mig",
                                         "mig_profile"))
        if "gpus" not in given and not share:
            flags["gpus"] = 1
    elif any(k != "command" for k in work) and "command" not in work:
        raise UsageError(f"{', '.join(sorted(k for k in work))} need a command: add -- CMD ARGS... "
                         "(or command: in the -f file)")
    return merge_spec(file_shape, flags), work


def cmd_submit(args: argparse.Namespace, gp: GpupoolClient) -> int:
    spec, work = job_request(args)
    job = gp.submit_job(spec.pop("name"), spec.pop("team"), spec.pop("gpus"), work=work or None, **spec)

    def render() -> str:
        models = "/".join(job.gpu_models) or "any model"
        head = (f"submitted job {job.job_id}" if job.created
                else f"job {job.job_id} was already submitted with idempotency key {job.idempotency_key}")
        limit = f" · max runtime {fmt_duration(job.max_runtime_s)}" if job.max_runtime_s else ""
        lines = [head, f"  {job.name} · team {job.team} · {job_shape(job)} of {models} · state {job.state}{limit}"]
        if work.get("command"):
            lines.append(f"  runs: {shlex.join(work['command'])}")
        if job.state == "awaiting_approval":
            why = "; ".join(job.approval_reasons) or job.message or "an approval rule"
            lines.append(f"  needs approval ({why}): gpupool approvals approve {job.approval_id or '<APPROVAL_ID>'}")
        lines.append(f"  watch it: gpupool describe {job.job_id}")
        if work.get("command"):
            lines.append(f"  its output: gpupool logs -f {job.job_id}")
        return "\n".join(lines)

    if args.quiet:  # J=$(gpupool submit -q ...)
        print(job.job_id)
        return EXIT_OK
    emit(args, job.raw, render)
    return EXIT_OK


# --- gpupool run: exit status -----------------------------------------------------------------------------------
_SIGNAL_NAME = re.compile(r"\b(SIG[A-Z0-9]+)\b")
_SIGNAL_NUMBER = re.compile(r"\bsignal (\d{1,2})\b", re.IGNORECASE)


def signal_number(*texts: str | None) -> int | None:
    """The signal named in a job's reason or message ("killed by SIGKILL", "signal 9"), if any."""
    for text in texts:
        if not text:
            continue
        for name in _SIGNAL_NAME.findall(text):
            try:
                return int(signal.Signals[name])
            except KeyError:
                continue
        number = _SIGNAL_NUMBER.search(text)
        if number and 0 < int(number.group(1)) < 65:
            return int(number.group(1))
    return None


def exit_status(state: str, exit_code: int | None, reason: str | None, message: str | None, *,
                interrupted: bool = False) -> int:
    """What `gpupool run` exits with once the job has ended (see the module's doc)."""
    if state == "completed":
        return 0
    if state == "cancelled":
        return 130 if interrupted else 1
    if state != "failed":
        return 1
    if exit_code is not None and exit_code > 0:
        return min(exit_code, 255)
    if exit_code is not None and exit_code < 0:  # killed by signal -N, as Python's subprocess reports it
        return 128 + min(-exit_code, 127)
    signo = signal_number(reason, message)
    if signo is not None:
        return 128 + signo
    if reason == "OutOfMemory":
        return 128 + int(signal.SIGKILL)  # the memory controller kills with SIGKILL
    return 1


def job_exit_status(job: Job, *, interrupted: bool = False) -> int:
    return exit_status(job.state, job.exit_code, job.reason, job.message, interrupted=interrupted)


# --- gpupool run: submit, wait, stream, exit ----------------------------------------------------------------------
class Runner:
    """One `gpupool run` after its submission: wait for the job to start, stream stdout and stderr (two followers,
    so each goes to its own file), turn the first Ctrl-C into a cancel and the second into an exit, and read the
    job's end for the exit status."""

    def __init__(self, gp: GpupoolClient, job_id: str, *, quiet: bool = False, poll_s: float = POLL_S,
                 out: IO[str] | None = None, err: IO[str] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.gp, self.job_id, self.quiet, self.poll_s, self.sleep = gp, job_id, quiet, poll_s, sleep
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.interrupted = False
        self.started = False
        self.pumps: list[threading.Thread] = []
        self.lost: list[str] = []
        self.state: str | None = None

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"gpupool: {text}", file=self.err, flush=True)

    def run(self) -> int:
        while True:
            try:
                if not self.started:
                    self.wait_until_started()
                self.stream()
                job = self.wait_until_finished()
                break
            except KeyboardInterrupt:
                if self.interrupted:
                    self.say(f"interrupted again: exiting now (job {self.job_id} is being cancelled)")
                    return 130
                self.interrupted = True
                self.cancel()
        status = job_exit_status(job, interrupted=self.interrupted)
        why = f" ({job.reason})" if job.reason and job.state != "completed" else ""
        self.say(f"job {self.job_id} {job.state}{why}: exit {status}")
        return status

    def cancel(self) -> None:
        self.say(f"cancelling job {self.job_id} (Ctrl-C again to exit at once) ...")
        try:
            self.gp.cancel_job(self.job_id, "cancelled by gpupool run (Ctrl-C)")
        except GpupoolError as exc:
            self.say(f"could not cancel: {exc}")

    def _watch(self, job: Job) -> None:
        if job.state != self.state:
            self.state = job.state
            where = f" on {job.cluster}/{job.node}" if job.node and job.state not in WAITING[:2] else ""
            detail = f": {job.message}" if job.message and job.state in WAITING else ""
            self.say(f"job {self.job_id} is {job.state}{where}{detail}")

    def _pauses(self) -> Iterator[float]:
        """FIRST_POLL_S, then half as long again each time, up to poll_s: a quick job is not kept waiting for a
        fixed half second, a long one costs the gateway two requests a second."""
        pause = min(FIRST_POLL_S, self.poll_s)
        while True:
            yield pause
            pause = min(self.poll_s, pause * 1.5)

    def wait_until_started(self) -> None:
        for pause in self._pauses():
            job = self.gp.get_job(self.job_id)
            self._watch(job)
            if job.state not in WAITING:
                self.started = True
                return
            self.sleep(pause)

    def stream(self) -> None:
        if not self.pumps:
            for stream, sink in (("stdout", self.out), ("stderr", self.err)):
                pump = threading.Thread(target=self.pump, args=(stream, sink), daemon=True,
                                        name=f"gpupool-run-{stream}")
                pump.start()
                self.pumps.append(pump)
        for pump in self.pumps:
            while pump.is_alive():
                pump.join(0.2)  # short joins: Ctrl-C reaches the main thread

    def pump(self, stream: str, sink: IO[str]) -> None:
        """Copy one stream of the job's output until it ends. A failure before any output is retried while the job
        may still produce some; one midway is reported (a retry would repeat what was already written)."""
        tries = 0
        while True:
            wrote = False
            try:
                for text in self.gp.follow_logs(self.job_id, stream=stream):  # type: ignore[arg-type]
                    wrote = True
                    sink.write(text)
                    sink.flush()
                return
            except GpupoolError as exc:
                tries += 1
                transient = exc.unreachable or exc.status in (502, 503, 504)
                if wrote or not transient or tries >= 20:
                    self.lost.append(f"{stream}: {exc}")
                    return
            except Exception as exc:  # a broken pipe on our side, a bug: the exit status still comes
                self.lost.append(f"{stream}: {type(exc).__name__}: {exc}")
                return
            self.sleep(1.0)

    def wait_until_finished(self) -> Job:
        for lost in self.lost:
            if "NoLogs" not in lost:
                self.say(f"log stream ended early ({lost}); waiting for the job to end")
        self.lost.clear()
        for pause in self._pauses():
            job = self.gp.get_job(self.job_id)
            self._watch(job)
            if job.finished:
                return job
            self.sleep(pause)
        raise AssertionError("unreachable")  # _pauses never ends


def cmd_run(args: argparse.Namespace, gp: GpupoolClient) -> int:
    spec, work = job_request(args, run=True, team_of_token=lambda: gp.whoami().team)
    job = gp.submit_job(spec.pop("name"), spec.pop("team"), spec.pop("gpus"), work=work, **spec)
    runner = Runner(gp, job.job_id, quiet=args.quiet, poll_s=POLL_S)
    runner.say(f"submitted job {job.job_id} ({job.name}, {job_shape(job)}); Ctrl-C cancels it")
    if job.state == "awaiting_approval":
        runner.say(f"it needs approval: gpupool approvals approve {job.approval_id or '<APPROVAL_ID>'}")
    return runner.run()


# --- gpupool logs -----------------------------------------------------------------------------------------------
def cmd_logs(args: argparse.Namespace, gp: GpupoolClient) -> int:
    where = {"replica": args.replica, "attempt": args.attempt, "stream": args.stream, "tail": args.tail}
    if args.tail is not None and args.tail < 1:
        raise UsageError("--tail must be at least 1")
    if args.follow:
        for text in gp.follow_logs(args.job_id, **where):
            sys.stdout.write(text)
            sys.stdout.flush()
    else:
        sys.stdout.write(gp.logs(args.job_id, **where))
        sys.stdout.flush()
    return EXIT_OK


# --- flags and wiring -------------------------------------------------------------------------------------------
def add_shape_flags(p: argparse.ArgumentParser, *, run: bool = False) -> None:
    p.add_argument("-f", "--file", help="YAML file with the job's fields (name, team, gpus, gpu_models, command, "
                                        "env, ... as in the HTTP body); '-' reads stdin")
    p.add_argument("--name", help="job name (lowercase, 1-63 chars)" + ("; default run-PROGRAM" if run else ""))
    p.add_argument("--team", help="default: the token's team" if run else None)
    p.add_argument("--project", help="project within the team (default: default)")
    p.add_argument("--gpus", type=int, help="whole GPUs on one node (per replica; a gang's total, which may be "
                                            "left out: gang nodes × GPUs per node)" + ("; default 1" if run else ""))
    p.add_argument("--model", dest="models", action="append", metavar="MODEL",
                   help="acceptable GPU model (repeatable; none means any), e.g. H100-80GB")
    p.add_argument("--kind", choices=JOB_KINDS, help="default batch")
    p.add_argument("--priority-class", help="e.g. " + ", ".join(PRIORITY_CLASSES) + " (default normal)")
    p.add_argument("--idempotency-key", help="make resubmission safe across runs (default: a fresh key)")
    p.add_argument("--gang-nodes", type=int, metavar="N", help="a gang over N nodes, placed all or nothing")
    p.add_argument("--gpus-per-node", type=int, metavar="N", help="with --gang-nodes: GPUs on each node")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="N independent copies of --gpus each (an inference service; change with `gpupool scale`)")
    p.add_argument("--max-runtime", metavar="DURATION",
                   help="declared limit, seconds or e.g. 30m, 8h (lets small jobs backfill; may be enforced)")
    p.add_argument("--fraction", metavar="SHARE",
                   help="a share of one GPU's compute on a fractional GPU: 0.25, 25%% or 250 (milli-GPU); "
                        "needs --gpu-memory")
    p.add_argument("--gpu-memory", metavar="SIZE", help="GPU memory of that share: MiB or e.g. 12GiB")
    p.add_argument("--mig", metavar="PROFILE", help="one MIG slice of this profile, e.g. 1g.10gb or 3g.40gb")
    p.add_argument("--exclusive", action="store_true",
                   help="dev jobs: a whole GPU (dev jobs otherwise get a share where the pool offers one)")
    p.add_argument("--cpu", metavar="CORES", help="host CPU reserved on each node it holds: cores (4, 0.5) or "
                                                  "milli-cores (500m); placement counts it against the node's CPUs")
    p.add_argument("--memory", metavar="SIZE", help="host memory reserved on each node it holds: MiB or e.g. 64GiB")
    p.add_argument("--selector", action="append", metavar="KEY=VALUE",
                   help="a node label the job's nodes must carry (repeatable: all of them), e.g. zone=a")
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None,
                   help="may be preempted for higher-priority work (--no-preemptible: never); default: the "
                        "priority class decides")


def add_work_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the work (after --: the command's argv; the flags below need one)")
    g.add_argument("--env", action="append", metavar="NAME=VALUE", help="environment variable (repeatable)")
    g.add_argument("--workdir", metavar="PATH", help="absolute directory on the node (default: a fresh one)")
    g.add_argument("--cpu-milli", type=int, metavar="N", help="CPU limit in milli-cores (1000 = one core)")
    g.add_argument("--memory-mib", metavar="SIZE", help="memory limit: MiB or e.g. 16GiB (beyond it: OutOfMemory)")
    g.add_argument("--pids", type=int, metavar="N", help="processes and threads at once")
    g.add_argument("--stop-signal", choices=SIGNALS, metavar="SIGNAL",
                   help="sent to stop the work: " + ", ".join(SIGNALS) + " (default SIGTERM)")
    g.add_argument("--stop-grace", metavar="DURATION", help="from the stop signal to the kill (default 30s)")
    g.add_argument("--warn-before", metavar="DURATION",
                   help="with --max-runtime: send --warn-signal this long before it")
    g.add_argument("--warn-signal", choices=SIGNALS, metavar="SIGNAL", help="the warning's signal (default SIGUSR1)")
    g.add_argument("--restart", metavar="POLICY", help="never, on_failure:N or on_failure:N:DELAY (default never)")
    g.add_argument("--isolation", choices=ISOLATIONS, help="process (default), sandbox or container")
    g.add_argument("--image", help="container: an image the node already has")
    g.add_argument("--rootfs", metavar="PATH", help="container: a root filesystem directory on the node")
    p.add_argument("command", nargs="*", metavar="-- CMD ARGS", help="the command the node's agent runs (argv)")


def register(sub: argparse._SubParsersAction, add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("submit", cmd_submit, "submit a job (from flags, a YAML file, or both: flags win); with -- CMD the "
                                  "node's agent runs it")
    add_shape_flags(p)
    add_work_flags(p)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the job id (for scripts: J=$(gpupool submit -q ...))")

    p = add("run", cmd_run, "run a command on pool GPUs and wait: submit, stream its output, exit with its status "
                            "(Ctrl-C cancels the job)")
    add_shape_flags(p, run=True)
    add_work_flags(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no status lines on stderr")

    p = add("logs", cmd_logs, "a job's output: stdout and stderr of its latest attempt (-f: follow until it ends)")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job has ended")
    p.add_argument("--replica", type=int, metavar="N", help="one replica or gang member (default: all, prefixed)")
    p.add_argument("--attempt", type=int, metavar="N", help="an earlier attempt (default: the latest)")
    p.add_argument("--stream", choices=LOG_STREAMS, default="both", help="default both")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines (of each stream and replica)")
