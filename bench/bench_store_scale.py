"""Benchmark: the per-trace JSON store against the segment store, in the same run.

    python bench/bench_store_scale.py                   # 20,000 traces
    python bench/bench_store_scale.py --traces 100000 --build
    python bench/bench_store_scale.py --traces 1000000 --build --stores segments --workers 2
    python bench/bench_store_scale.py --traces 100000 --scored --build --stores segments --workers 2

Ingest: `write_many` of synthetic traces (flowrl.data.synthetic: 1-3 tool calls per run) in batches of
`--batch`, into a `TraceStore` (one fsynced file per trace, one filesystem sync per batch) and into a
`SegmentStore` (one Parquet segment per batch), traces/s; each batch is generated off the clock.
`--build`: a KTO set from each store, each build in a fresh process reporting its wall time and its own peak RSS
(`VmHWM`: `ru_maxrss` is kept across exec, and gave the build the scoring process's size) (the issue's target:
1,000,000 traces in under 60 s and 1 GiB: see docs/benchmarks.md). The segment store's build is the columnar one
(`flowrl.data.columnar`), the JSON store's the row-by-row one. `--workers N`: the columnar build makes its rows
in N more processes (`flowrl.data.workers`); each one's peak RSS is reported, and their sum with the main
process's. `--scored`: before the build, every trace gets a score as `flowrl score`
writes one (`store.update`: a side record per trace in a segment store), off the clock.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import json, sys, time
from flowrl.data import DatasetPipeline
from flowrl.data.workers import peak_mib
from flowrl.methods import make_builder
from flowrl.store.opener import open_store
store, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.perf_counter()
pipeline = DatasetPipeline(make_builder("kto"), workers=workers)
result = pipeline.build(open_store(store), out)
elapsed = time.perf_counter() - t
peak = peak_mib()  # VmHWM: ru_maxrss would give this process the RSS of the one that forked it
workers = [round(pipeline.worker_peaks[k]) for k in sorted(pipeline.worker_peaks)]
print(json.dumps({"seconds": elapsed, "peak_mib": peak, "worker_peaks_mib": workers,
                  "peak_sum_mib": peak + sum(workers), "rows": sum(result.counts.values())}))
"""


def ingest(n: int, batch: int, root: Path, kinds: list[str]) -> dict[str, float]:
    from flowrl.data.synthetic import synthetic_trace
    from flowrl.store.files import TraceStore
    from flowrl.store.segments import SegmentStore

    rates = {}
    stores = {"json": lambda: TraceStore(root / "json"), "segments": lambda: SegmentStore(root / "segments")}
    for name in kinds:
        store: Any = stores[name]()
        elapsed = 0.0
        for start in range(0, n, batch):
            traces = [synthetic_trace(i) for i in range(start, min(n, start + batch))]  # made off the clock
            t = time.perf_counter()
            store.write_many(traces)
            elapsed += time.perf_counter() - t
        t = time.perf_counter()
        if hasattr(store, "flush"):
            store.flush()
        rates[name] = n / (elapsed + time.perf_counter() - t)
        print(f"ingest {name:9s} {rates[name]:9,.0f} traces/s", file=sys.stderr)
    return rates


def score_all(n: int, root: Path, kinds: list[str]) -> None:
    """Give every trace a score, label and reward details, as `flowrl score` records them (`store.update`)."""
    from flowrl.data.synthetic import synthetic_trace
    from flowrl.store.opener import open_store

    for name in kinds:
        store = open_store(str(root / name))
        t = time.perf_counter()
        for i in range(n):
            trace = synthetic_trace(i)
            score = (i * 7919 % 1000) / 1000
            trace.reward_score, trace.label, trace.label_source = score, score >= 0.5, "engine"
            trace.rewards = {"tool_success": score, "host_outcome": None}
            trace.reward_details = {"tool_success": {"calls": 2, "counted": 2, "failed": 0}}
            store.update(trace)
        store.close()
        print(f"scored {name:9s} {n / (time.perf_counter() - t):9,.0f} traces/s", file=sys.stderr)


def build(root: Path, kinds: list[str], workers: int) -> dict[str, dict[str, float]]:
    out = {}
    for name in kinds:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(root / name), str(root / f"out-{name}"), str(workers)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode:
            raise SystemExit(f"build from {name} failed:\n{proc.stderr[-2000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"build  {name:9s} {out[name]}", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--build", action="store_true", help="also build a KTO set from each store")
    parser.add_argument("--stores", default="json,segments", help="which stores: json,segments (default both)")
    parser.add_argument("--scored", action="store_true", help="score every trace (side records) before the build")
    parser.add_argument(
        "--workers", type=int, default=1, help="build processes besides the main one (columnar KTO build only)"
    )
    args = parser.parse_args()
    kinds = [k for k in args.stores.split(",") if k]
    with tempfile.TemporaryDirectory(prefix="flowrl-bench-scale-") as tmp:
        root = Path(tmp)
        result: dict[str, object] = {
            "traces": args.traces,
            "batch": args.batch,
            "ingest": ingest(args.traces, args.batch, root, kinds),
        }
        if args.scored:
            score_all(args.traces, root, kinds)
        if args.build:
            result["build"] = build(root, kinds, args.workers)
    rates = result["ingest"]
    assert isinstance(rates, dict)
    if len(rates) == 2:
        print("| traces | JSON store | segment store | ratio |\n|---:|---:|---:|---:|")
        print(
            f"| {args.traces:,} | {rates['json']:,.0f}/s | {rates['segments']:,.0f}/s "
            f"| {rates['segments'] / rates['json']:.1f}x |"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
