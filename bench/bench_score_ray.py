"""Scoring throughput (traces/s): `flowrl score` in one process against `flowrl score --ray` with 1 and 2 workers.

    python bench/bench_score_ray.py [--traces 300] [--repeats 1] [--json out.json]

The traces are generated once (each runs 1-3 snippets of Python or shell through an exec-like tool, about one in
five of them failing, so the code-execution reward has real work in the sandbox) and every run scores a fresh
copy of that store with the default rewards, writing the results back. Ray is a local head on 127.0.0.1 with 2
CPUs, started once before the Ray runs (its start-up is reported on its own line, not counted in the rates); each
Ray run does count starting its actors and their sandboxes, as `flowrl score --ray` does. The one-process run
uses `flowrl score`'s defaults (4 threads, one sandbox). Every run must score every trace.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import ScoreSummary, score_store
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

SNIPPETS = [
    ("exec_code", "code", "print(sum(i * i for i in range(1000)))", True),
    ("python", "code", "import json\nprint(json.dumps({'a': [1, 2, 3]}))", True),
    ("run_python", "code", "xs = sorted(range(500), reverse=True)\nassert xs[0] == 499", True),
    ("bash", "command", "echo hello | wc -c", True),
    ("exec_code", "code", "raise ValueError('bad input')", False),
    ("shell", "command", "exit 3", False),
]


def generate(root: Path, n: int, seed: int = 7) -> TraceStore:
    """`n` traces over n/3 tasks, each with 1-3 code tool calls."""
    rng = random.Random(seed)
    store = TraceStore(root)
    traces = []
    for i in range(n):
        calls = []
        for _ in range(rng.randint(1, 3)):
            tool, key, code, ok = rng.choice(SNIPPETS)
            calls.append(ToolCallTrace(tool_name=tool, arguments={key: code}, result="" if ok else "Error", success=ok))
        traces.append(
            ExecutionTrace(
                trace_id=f"bench-{i:05d}",
                timestamp=f"2026-11-{1 + i % 28:02d}T10:00:00",
                user_query=f"task {i % max(1, n // 3)}: compute it",
                final_response="done",
                success=all(c.success for c in calls),
                tool_calls=calls,
            )
        )
    store.write_many(traces)
    return store


def timed(template: Path, work: Path, run: Callable[[TraceStore, RewardEngine], ScoreSummary], n: int) -> float:
    """Traces/s of one run on a fresh copy of the template store."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    store = TraceStore(work)
    with RewardEngine.from_config(None) as engine:
        start = time.perf_counter()
        summary = run(store, engine)
        elapsed = time.perf_counter() - start
    if summary.scored != n or summary.failed:
        raise SystemExit(f"run scored {summary.scored} of {n} traces ({summary.failed} failed): {summary.errors[:3]}")
    return n / elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    import ray

    from flowrl.rewards.ray_scoring import LOCAL_ENV, score_store_ray

    columns = ("one_process", "ray_1", "ray_2")
    runs: dict[str, list[float]] = {c: [] for c in columns}
    with tempfile.TemporaryDirectory(prefix="flowrl-bench-score-") as tmp:
        template, work = Path(tmp) / "template", Path(tmp) / "work"
        generate(template, args.traces)
        load_before = os.getloadavg()[0]
        os.environ.update(LOCAL_ENV)
        start = time.perf_counter()
        ray.init(
            address="local", num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False
        )
        ray_start = time.perf_counter() - start
        try:
            for _ in range(args.repeats):
                runs["one_process"].append(timed(template, work, lambda s, e: score_store(s, e), args.traces))
                for w in (1, 2):
                    run = lambda s, e, w=w: score_store_ray(s, e, ray_workers=w)  # noqa: E731
                    runs[f"ray_{w}"].append(timed(template, work, run, args.traces))
        finally:
            ray.shutdown()
        load_after = os.getloadavg()[0]
    rates = {c: statistics.median(v) for c, v in runs.items()}
    print(
        f"\nflowrl score on {args.traces} generated traces with code, default rewards, {os.cpu_count()} CPUs "
        f"(Ray: 2), Python {sys.version.split()[0]}, Ray {ray.__version__}, load average {load_before:.1f} -> "
        f"{load_after:.1f}; median of {args.repeats} run(s); local Ray head start-up {ray_start:.1f} s (not counted)\n"
    )
    print("| run | traces/s | vs one process |")
    print("|---|---:|---:|")
    labels = {"one_process": "one process (`flowrl score`)", "ray_1": "Ray, 1 worker", "ray_2": "Ray, 2 workers"}
    for c in columns:
        print(f"| {labels[c]} | {rates[c]:.1f} | {rates[c] / rates['one_process']:.2f}x |")
    print(f"\nRay 2 workers vs 1: {rates['ray_2'] / rates['ray_1']:.2f}x")
    report = {
        "traces": args.traces,
        "cpus": os.cpu_count(),
        "ray_cpus": 2,
        "ray_start_s": ray_start,
        "load": [load_before, load_after],
        "rates": rates,
        "ratios": {c: rates[c] / rates["one_process"] for c in columns}
        | {"ray_2_vs_ray_1": rates["ray_2"] / rates["ray_1"]},
        "runs": runs,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    main()
