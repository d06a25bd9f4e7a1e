"""Opening and planning a table after many commits, with and without timeline archival.

A table that has seen N commits (small upserts, one partition, a clean every 20) is opened in a
fresh process and its snapshot read (`Table(uri)` then `to_arrow`), best of `--repeat`. With
archival (Apache Hudi's defaults: keep 20 to 30 commits, inline after each commit) the active
timeline stays short, so the cost should not grow with N. Without archival
(`set_archival(..., inline=False)`) every open lists and reads the whole timeline. `--latency MS ...`
probes each table with a simulated per-request store latency (`oxlake.testing.inject_faults`), one
row per latency; `--s3` puts the tables on a local SeaweedFS S3 server (the tests' `weed`);
`--metadata` builds the metadata table first.

    python benches/timeline.py --commits 100 10000 [--latency 0 20] [--repeat 5] [--metadata] [--s3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import oxlake
import pyarrow as pa

PROBE = """
import sys, time, json, oxlake
from oxlake.testing import inject_faults
uri, latency, options = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
if latency:
    inject_faults(f"latency={latency}")
start = time.perf_counter()
t = oxlake.Table(uri, storage_options=options or None)
opened = time.perf_counter()
n = t.to_arrow(columns=["id"]).num_rows
done = time.perf_counter()
print(json.dumps({"open": opened - start, "read": done - opened, "rows": n, "active": len(t.timeline())}))
"""


def build(uri: str, options: dict[str, str] | None, commits: int, archive: bool, metadata: bool) -> float:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.int64())])
    t = oxlake.create_table(uri, schema, record_key="id", ordering_field="ts", storage_options=options)
    if metadata:
        t.build_metadata()
    if not archive:
        t.set_archival(20, 30, inline=False)
    start = time.perf_counter()
    for n in range(commits):
        ids = [n % 1000, 1000 + n]
        t.upsert(pa.table({"id": ids, "v": [f"v{n}"] * 2, "ts": [n, n]}, schema=schema))
        if n % 20 == 19:
            # Cleans keep the data files as many whatever the number of commits: what grows is the
            # timeline alone (and the cleans are on it too, as in a real table).
            t.clean(retain=10)
    return time.perf_counter() - start


def probe(uri: str, options: dict[str, str] | None, latency: int, repeat: int) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", PROBE, uri, str(latency), json.dumps(options or {})],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise SystemExit(out.stderr)
        runs.append(json.loads(out.stdout))
    best = min(runs, key=lambda r: r["open"] + r["read"])
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, nargs="+", default=[100, 10000])
    parser.add_argument("--latency", type=int, nargs="+", default=[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-unarchived", action="store_true", help="skip the tables without archival")
    parser.add_argument("--metadata", action="store_true", help="with the metadata table (no listing)")
    parser.add_argument("--s3", action="store_true", help="on a local SeaweedFS S3 server")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        place = lambda name: (str(Path(tmp, name)), None)  # noqa: E731
        if args.s3:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from seaweed import SeaweedS3

            s3 = stack.enter_context(SeaweedS3())
            s3.create_bucket("timeline")
            place = lambda name: (f"s3://timeline/{name}", s3.storage_options())  # noqa: E731
        rows = []
        for commits in args.commits:
            for archive in (True, False):
                if not archive and args.no_unarchived:
                    continue
                uri, options = place(f"t{commits}_{archive}")
                built = build(uri, options, commits, archive, args.metadata)
                for latency in args.latency:
                    r = probe(uri, options, latency, args.repeat)
                    rows.append((commits, archive, latency, r))
                    print(
                        f"commits={commits:>6} archival={'on ' if archive else 'off'} latency={latency:>3}ms "
                        f"build={built:7.1f}s active={r['active']:>6} open={r['open'] * 1000:8.1f}ms "
                        f"plan+read={r['read'] * 1000:8.1f}ms "
                        f"total={(r['open'] + r['read']) * 1000:8.1f}ms",
                        flush=True,
                    )
        for latency in args.latency:
            on = [(c, r) for c, a, lat, r in rows if a and lat == latency]
            if len(on) >= 2:
                (c0, r0), (c1, r1) = on[0], on[-1]
                ratio = (r1["open"] + r1["read"]) / (r0["open"] + r0["read"])
                print(f"archival on: {c1} commits cost {ratio:.2f}x of {c0} commits (latency {latency} ms)")


if __name__ == "__main__":
    main()
