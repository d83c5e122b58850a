"""What every people-facing command shares: exit codes, the values flags accept, usage errors, duration and time
parsing, the API client, and the wiring that turns a command function into a subcommand (`Adder`, `run_api`)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from libs.client import ConfigError, GpupoolClient, GpupoolError

Command = Callable[[argparse.Namespace, GpupoolClient], int]

EXIT_OK, EXIT_API, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
JOB_STATES = ("awaiting_approval", "pending", "launching", "running", "preempting", "completed", "cancelled",
              "failed")
APPROVAL_STATES = ("pending", "approved", "denied")
APPROVAL_RULES = ("gpus_over", "runtime_over_s", "priority_class")
JOB_KINDS = ("training", "inference", "dev", "batch")
PRIORITY_CLASSES = ("production-inference", "high", "normal", "low", "best-effort")
ROLES = ("platform-admin", "operator", "team-admin", "member", "viewer", "service")


class UsageError(Exception):
    """Bad input from the user (exit 2)."""


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | float | int) -> float:
    """Seconds from "3600", "90s", "30m", "2h", "1d" or "1h30m"."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return float(text)
    raw = str(text).strip().lower()
    try:
        return float(raw)
    except ValueError:
        pass
    parts = _DURATION.findall(raw)
    if not raw or not parts or "".join(n + u for n, u in parts) != raw:
        raise UsageError(f"{text!r} is not a duration (seconds, or e.g. 90s, 30m, 2h, 1d, 1h30m)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """A report bound: an ISO date or time ("2026-03-01", "2026-03-01T08:00:00Z", no zone = UTC), "now", or a
    duration before now ("7d", "12h", "1h30m")."""
    now = now or datetime.now(UTC)
    raw = text.strip()
    if raw.lower() == "now":
        return now
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError:
        try:
            return now - timedelta(seconds=parse_duration(raw))
        except UsageError:
            raise UsageError(f"{text!r} is not a time (2026-03-01, 2026-03-01T08:00Z, now, or an age like 7d, "
                             "12h)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def report_range(args: argparse.Namespace) -> tuple[datetime | None, datetime | None]:
    """Both bounds from one `now`, so `--from 1h` covers exactly the last hour."""
    now = datetime.now(UTC)
    end = parse_when(args.end, now) if args.end else None
    start = parse_when(args.start, now) if args.start else None
    return start, end if end is not None or start is None else now


# --- client ---------------------------------------------------------------------------------------------------------
def make_client(args: argparse.Namespace) -> GpupoolClient:
    """Built from --url/--token, else the environment, else run.json. Tests replace this function."""
    return GpupoolClient.from_env(getattr(args, "url", None), getattr(args, "token", None))


# --- wiring ---------------------------------------------------------------------------------------------------------
def fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def run_api(func: Command) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: build the client, run, and turn every failure into one line on stderr and an exit code."""

    def runner(args: argparse.Namespace) -> int:
        try:
            gp = make_client(args)
            try:
                return func(args, gp)
            finally:
                gp.close()
        except ConfigError as exc:
            return fail(exc.detail, EXIT_USAGE)
        except UsageError as exc:
            return fail(str(exc), EXIT_USAGE)
        except GpupoolError as exc:
            return fail(str(exc), EXIT_UNREACHABLE if exc.unreachable else EXIT_API)
        except KeyboardInterrupt:
            return fail("interrupted", 130)
        except BrokenPipeError:  # `gpupool jobs | head`
            try:
                sys.stdout = open(os.devnull, "w")  # silence the flush at exit
            except OSError:
                pass
            return EXIT_OK
        except Exception as exc:  # a bug in the CLI or a response it cannot read: still one line, no traceback
            if os.environ.get("GPUPOOL_DEBUG"):
                raise
            text = " ".join(str(exc).split())[:300]
            return fail(f"unexpected {type(exc).__name__}: {text} (set GPUPOOL_DEBUG=1 for a traceback)", EXIT_API)

    runner.__name__ = func.__name__
    return runner


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection and output")
    g.add_argument("--url", help="gateway URL (default $GPUPOOL_URL, else run.json of `gpupool up`)")
    g.add_argument("--token", help="API token (default $GPUPOOL_TOKEN, else the admin token in run.json)")
    g.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    return common


class Adder:
    """`add(name, func, text[, parent])`: a subcommand under `parent` (default: the top-level commands) with the
    connection and output flags, running `func` through `run_api`. Each command group's `register(sub, add)` uses
    it; `common` is the parent parser of those flags, for a subcommand added by hand."""

    def __init__(self, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
        self.sub, self.common = sub, common

    def __call__(self, name: str, func: Command, text: str,
                 parent: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:
        p = (self.sub if parent is None else parent).add_parser(name, help=text, description=text, parents=[self.common])
        p.set_defaults(func=run_api(func))
        return p
