"""`gpupool check`: verify the platform's invariants from its stores and streams (read-only).

Where to look: `--run-file` (default `<data-dir>/run.json`, written by `gpupool up`), or explicit `--dsn
SERVICE=DSN` (repeatable), `--database-url ADMIN_DSN --database-prefix P` (databases `<P>_<service>`) and
`--nats-url`. Exit status: 0 every invariant holds, 1 a violation was found, 2 a source could not be read."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from libs.check.model import CHECKS
from libs.check.runner import SERVICES, CheckConfig, check


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpupool check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="checks:\n" + "\n".join(f"  {k:<18} {v}" for k, v in CHECKS.items()))
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("GPUPOOL_DATA_DIR", ".gpupool")),
                   help="where `gpupool up` wrote run.json (default .gpupool)")
    p.add_argument("--run-file", type=Path, default=None, help="a run.json to read locations from")
    p.add_argument("--dsn", action="append", default=[], metavar="SERVICE=DSN",
                   help="one service's database (repeatable; overrides the run file)")
    p.add_argument("--database-url", default=None, metavar="ADMIN_DSN",
                   help="a server DSN; each service's database is <prefix>_<service> on it")
    p.add_argument("--database-prefix", default=os.environ.get("GPUPOOL_DATABASE_PREFIX", "gpupool"))
    p.add_argument("--nats-url", default=None, help="NATS server(s), comma-separated (overrides the run file)")
    p.add_argument("--no-streams", action="store_true", help="check the stores only")
    p.add_argument("--outbox-max-age", type=float, default=30.0, metavar="S",
                   help="an unpublished outbox row older than this is a violation (default 30)")
    p.add_argument("--lag-max-age", type=float, default=60.0, metavar="S",
                   help="a message a durable consumer left undelivered or unacknowledged this long is a violation "
                        "(default 60)")
    p.add_argument("--pending-max-age", type=float, default=60.0, metavar="S",
                   help="a job the queue has wanted this long (outside a requeue back-off) must be known to placement "
                        "and placed or given a reason by a scheduling cycle (default 60)")
    p.add_argument("--decision-max-age", type=float, default=60.0, metavar="S",
                   help="placement must have recorded a decision since the submission of every job it has wanted "
                        "unplaced this long (default 60)")
    p.add_argument("--telemetry-max-age", type=float, default=60.0, metavar="S",
                   help="a node inventory holds as ready must have a GPU sample stored within this long (default 60)")
    p.add_argument("--settle", type=float, default=0.0, metavar="S",
                   help="on a violation, look again for up to S seconds before reporting it (default 0)")
    p.add_argument("--only", default=None, metavar="CHECK[,CHECK]", help="run only these checks")
    p.add_argument("--json", action="store_true", help="the whole report as JSON")
    return p


def config_from_args(args: argparse.Namespace) -> CheckConfig:
    run_file = args.run_file or (args.data_dir / "run.json")
    overrides = dict(outbox_max_age_s=args.outbox_max_age, lag_max_age_s=args.lag_max_age,
                     pending_max_age_s=args.pending_max_age, decision_max_age_s=args.decision_max_age,
                     telemetry_max_age_s=args.telemetry_max_age,
                     settle_s=args.settle,
                     only=set(args.only.split(",")) if args.only else None)
    explicit = bool(args.dsn or args.database_url)
    if run_file.exists() and not explicit:
        config = CheckConfig.from_run_file(run_file, **overrides)
    elif args.run_file is not None and not run_file.exists():
        raise SystemExit(f"gpupool check: no run file {run_file}")
    else:
        config = CheckConfig(**overrides)
    if args.database_url:
        from libs.store.database import with_database

        config.database_urls.update({s: with_database(args.database_url, f"{args.database_prefix}_{s}")
                                     for s in SERVICES})
    for item in args.dsn:
        service, eq, dsn = item.partition("=")
        if not eq or service not in SERVICES:
            raise SystemExit(f"gpupool check: --dsn expects SERVICE=DSN with SERVICE one of {', '.join(SERVICES)}")
        config.database_urls[service] = dsn
    if args.nats_url:
        config.nats_url = args.nats_url
    if args.no_streams:
        config.nats_url = None
    if config.only and not config.only <= set(CHECKS):
        raise SystemExit(f"gpupool check: unknown check(s) {sorted(config.only - set(CHECKS))}")
    if not config.database_urls and not config.nats_url:
        raise SystemExit(f"gpupool check: nothing to check (no {run_file}; give --run-file, --dsn or --database-url)")
    return config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = check(config_from_args(args))
    print(report.to_json() if args.json else report.to_text())
    if report.violations:
        return 1
    return 2 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
