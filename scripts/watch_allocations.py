#!/usr/bin/env python3
"""Print every allocation event as it happens, the way any other system would see it: a plain core-NATS
subscription on `gpupool.allocation.>`. Each message is checked to be a valid gpupool CloudEvent.

  .venv/bin/python scripts/watch_allocations.py            # NATS URL from .gpupool/run.json
  .venv/bin/python scripts/watch_allocations.py --count 1  # exit after the first event
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import nats

from libs.contracts.envelope import InvalidEnvelope, parse_envelope
from libs.contracts.events import decode_data


async def watch(url: str, subject: str, count: int | None) -> int:
    nc = await nats.connect(url)
    seen = 0
    done = asyncio.Event()

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        nonlocal seen
        try:
            envelope = parse_envelope(msg.data)
            decode_data(envelope)
            verdict = "valid CloudEvent"
        except InvalidEnvelope as exc:
            verdict = f"INVALID: {exc}"
        print(f"--- {msg.subject}  ({verdict})")
        print(json.dumps(json.loads(msg.data), indent=2), flush=True)
        seen += 1
        if count is not None and seen >= count:
            done.set()

    await nc.subscribe(subject, cb=on_msg)
    print(f"listening on {subject} at {url}", file=sys.stderr, flush=True)
    try:
        await done.wait()
    finally:
        await nc.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", help="default: nats_url from <data-dir>/run.json")
    parser.add_argument("--data-dir", type=Path, default=Path(".gpupool"))
    parser.add_argument("--subject", default="gpupool.allocation.>")
    parser.add_argument("--count", type=int, default=None, help="exit after this many events")
    args = parser.parse_args()
    url = args.nats_url
    if url is None:
        try:
            url = json.loads((args.data_dir / "run.json").read_text())["nats_url"]
        except FileNotFoundError:
            print(f"no {args.data_dir}/run.json: start the platform with ./dev up, or pass --nats-url",
                  file=sys.stderr)
            return 2
    try:
        return asyncio.run(watch(url, args.subject, args.count))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
