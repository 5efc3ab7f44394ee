"""mercury.timeline: one Chrome trace from every worker's timeline.

Each worker of a job run with ``MERCURY_TIMELINE=DIR`` (or
``Worker(timeline=DIR)``) writes ``DIR/<node>.json`` at shutdown. Their
timestamps are all CLOCK_MONOTONIC, so on one machine they line up::

    /usr/bin/python3 -m mercury.timeline DIR      # writes DIR/timeline.json

Open the result in https://ui.perfetto.dev or chrome://tracing: one process
per worker, its trainer rows (forward, wait, backward) first, then a row per
tensor in priority order with each iteration's queued, push, aggregate and
pull phases (docs/timeline.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["merge", "main"]


def merge(files: Sequence[str], out: str) -> Dict[str, Any]:
    """Writes the union of the traces in ``files`` to ``out``; returns it."""
    events: List[Any] = []
    for f in files:
        with open(f) as fh:
            try:
                events.extend(json.load(fh)["traceEvents"])
            except (ValueError, KeyError) as e:
                raise ValueError(f"{f}: not a Mercury timeline ({e})") from None
    merged = {"displayTimeUnit": "ms", "traceEvents": events}
    with open(out, "w") as fh:
        json.dump(merged, fh)
    return merged


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m mercury.timeline",
                                description="Merge the workers' timelines of a run.")
    p.add_argument("dir", help="the MERCURY_TIMELINE directory")
    p.add_argument("--out", help="default: DIR/timeline.json")
    a = p.parse_args(argv)
    out = a.out or os.path.join(a.dir, "timeline.json")
    files = sorted(f for f in glob.glob(os.path.join(a.dir, "*.json"))
                   if os.path.abspath(f) != os.path.abspath(out))
    if not files:
        print(f"mercury.timeline: no timeline in {a.dir}", file=sys.stderr)
        return 1
    merged = merge(files, out)
    print(f"{out}: {len(files)} workers, {len(merged['traceEvents'])} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
