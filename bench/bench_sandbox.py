"""Sandboxed snippets per second, next to the naive way (one `python -c` subprocess per snippet).

    python bench/bench_sandbox.py [--n 400] [--repeats 3] [--naive-n 60] [--json out.json]

Cases: `trivial` is `print(1+1)`; `json_loop` imports json and dumps a small dict 1000 times.
The sandbox runs them through `Sandbox.run_many` on a warm pool (one worker per core, the isolation
it picks here: bwrap when installed); the baselines run `subprocess.run([python, "-c", code])` (and
with `-I -S`) one after another. Columns are measured interleaved, so a burst of load from elsewhere
hits them alike; the table shows medians and the load average around the run. Every snippet must
succeed or the bench fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from flowrl.rewards.sandbox import Sandbox

CASES = {
    "trivial": "print(1+1)",
    "json_loop": (
        "import json\nfor i in range(1000):\n    json.dumps({'a': i, 'b': [1, 2, 3], 'c': 'x'})\nprint('done')"
    ),
}


def sandbox_rate(sandbox: Sandbox, code: str, n: int) -> float:
    start = time.perf_counter()
    results = sandbox.run_many([code] * n)
    elapsed = time.perf_counter() - start
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"sandbox run failed: {bad[0]}")
    return n / elapsed


def subprocess_rate(argv: list[str], code: str, n: int) -> float:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    start = time.perf_counter()
    for _ in range(n):
        proc = subprocess.run([*argv, code], capture_output=True, stdin=subprocess.DEVNULL, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"baseline failed: {proc.stderr[-500:]!r}")
    return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="snippets per sandbox run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-n", type=int, default=60, help="snippets per baseline run")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    python = os.path.realpath(sys.executable)
    columns = ("sandbox", "naive", "naive_isolated")
    runs: dict[str, dict[str, list[float]]] = {case: {c: [] for c in columns} for case in CASES}
    load_before = os.getloadavg()[0]
    with Sandbox() as sandbox:
        sandbox.run_many(["pass"] * (4 * sandbox.workers))  # start every worker
        isolation, workers = sandbox.isolation, sandbox.workers
        for _ in range(args.repeats):
            for case, code in CASES.items():
                runs[case]["sandbox"].append(sandbox_rate(sandbox, code, args.n))
                runs[case]["naive"].append(subprocess_rate([python, "-c"], code, args.naive_n))
                runs[case]["naive_isolated"].append(subprocess_rate([python, "-I", "-S", "-c"], code, args.naive_n))
    load_after = os.getloadavg()[0]
    rows = [{"case": case, **{c: statistics.median(v) for c, v in cols.items()}} for case, cols in runs.items()]

    print(
        f"\nflowrl sandbox, isolation `{isolation}`, {workers} workers, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}, load average {load_before:.1f} -> {load_after:.1f}; "
        f"median of {args.repeats} runs of {args.n} sandboxed / {args.naive_n} naive snippets\n"
    )
    print("| case | sandbox (snippets/s) | `python -c` sequential | ratio | `python -I -S -c` sequential | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['sandbox']:.0f} | {r['naive']:.1f} | {r['sandbox'] / r['naive']:.1f}x "
            f"| {r['naive_isolated']:.1f} | {r['sandbox'] / r['naive_isolated']:.1f}x |"
        )
    report = {
        "isolation": isolation,
        "workers": workers,
        "cpus": os.cpu_count(),
        "load": [load_before, load_after],
        "rows": rows,
        "runs": runs,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return report


if __name__ == "__main__":
    main()
