"""Benchmark: build time and peak memory of `flowrl build-dataset` on synthetic stores.

    python bench/bench_dataset.py                 # 10,000 and 100,000 traces, KTO
    python bench/bench_dataset.py --sizes 10000 --methods kto sft dpo grpo-offline

For each size a synthetic store (flowrl.data.synthetic: 1-3 tool calls per run, 1,000 tasks) is
written to a temporary folder first; its generation time is not counted. Each build then runs in a
fresh subprocess, which reports its wall time and its own peak resident memory (VmHWM, with the interpreter
and the imported libraries; not ru_maxrss, which Linux keeps across exec: a subprocess of this bench reported
this bench's size there when it was the bigger). Target: 100,000 traces to a KTO set in under
60 s with under 1 GiB peak memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
from flowrl.data import DatasetPipeline
from flowrl.data.workers import peak_mib
from flowrl.methods import make_builder
from flowrl.store.files import TraceStore
store, out, method = sys.argv[1:4]
t = time.perf_counter()
result = DatasetPipeline(make_builder(method)).build(TraceStore(store), out)
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "peak_mib": peak_mib(), "rows": sum(result.counts.values()),
                  "traces": result.stats.traces_read}))
"""

TARGET_S = 60.0
TARGET_MIB = 1024.0


def run(sizes: list[int], methods: list[str], n_tasks: int) -> list[dict]:
    from flowrl.data.synthetic import write_synthetic_store

    results = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="flowrl-bench-") as tmp:
            store = Path(tmp) / "store"
            t = time.perf_counter()
            write_synthetic_store(store, size, n_tasks=n_tasks)
            gen = time.perf_counter() - t
            print(f"generated {size} traces in {gen:.1f}s (not counted)", file=sys.stderr)
            for method in methods:
                out = Path(tmp) / f"out-{method}"
                proc = subprocess.run(
                    [sys.executable, "-c", CHILD, str(store), str(out), method],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if proc.returncode:
                    raise SystemExit(f"build failed for {method} x {size}:\n{proc.stderr[-2000:]}")
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                row.update(method=method, size=size)
                results.append(row)
                print(f"{method} x {size}: {row['seconds']:.1f}s, {row['peak_mib']:.0f} MiB", file=sys.stderr)
    return results


def table(results: list[dict]) -> str:
    lines = ["| method | traces | rows | build s | traces/s | peak MiB | target |", "|---|---|---|---|---|---|---|"]
    for r in results:
        target = ""
        if r["method"] == "kto" and r["size"] >= 100_000:
            ok = r["seconds"] < TARGET_S and r["peak_mib"] < TARGET_MIB
            target = ("met" if ok else "MISSED") + f" (<{TARGET_S:.0f}s, <{TARGET_MIB:.0f} MiB)"
        lines.append(
            f"| {r['method']} | {r['size']:,} | {r['rows']:,} | {r['seconds']:.1f} | "
            f"{r['size'] / r['seconds']:,.0f} | {r['peak_mib']:.0f} | {target} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--methods", nargs="+", default=["kto"])
    parser.add_argument("--tasks", type=int, default=1000, help="distinct tasks (groups) in the synthetic store")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = run(args.sizes, args.methods, args.tasks)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
