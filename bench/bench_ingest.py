"""Ingest throughput and memory on a large synthetic FlowAgent data dir.

    python bench/bench_ingest.py [--files 1000] [--sessions 20] [--keep DIR]

Builds `{tmp}/data/Agents/checkpoint/bench_agent/agent_checkpoint_*.pkl` the way FlowAgent fills it: every
file is a full snapshot of all sessions, and each new file adds one run to one session (round-robin), so
the same turns repeat across files; histories are capped at max_history=100 messages; each session
carries VFS content and the agent a tool registry (about 80 KB per file). The obs dir holds the last 3
runs. Then, each in a fresh process pinned to one core:

* `snapshots/100` and `snapshots/1000`: ingest the first 100 / all files into an empty store;
* `all-new`: 100 files whose every turn is new (20 sessions x 1 turn each), to time the store writes.

Reported per case: files/s, traces read/s (every turn of every file, the dedup path included), new
traces/s (built, masked, written with fsync), and peak memory (ru_maxrss and the tracemalloc peak of
the Python heap). Memory must not grow with the number of files.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes import flowagent_files as samples  # noqa: E402

AGENT = "bench_agent"


def _run_id(n: int) -> str:
    return f"{n:08x}"


def build(root: Path, files: int, sessions: int, *, all_new: bool = False) -> Path:
    cp_dir = root / "Agents" / "checkpoint" / AGENT
    cp_dir.mkdir(parents=True, exist_ok=True)
    start = datetime(2026, 11, 22, 8, 0, 0)
    histories: dict[str, list[dict]] = {f"session_{s:02d}": [] for s in range(sessions)}
    n = 0
    for f in range(files):
        if all_new:
            histories = {f"f{f:04d}_s{s:02d}": [] for s in range(sessions)}
            targets = list(histories)
        else:
            targets = [f"session_{f % sessions:02d}"]
        for sid in targets:
            n += 1
            q = f"Task {n}: summarise the quarterly numbers for region {n % 7} and list the three largest changes."
            a = (
                f"Run {n} done. "
                + "Region figures were compared quarter over quarter; the largest changes are listed. " * 4
            )
            histories[sid] = (histories[sid] + samples.turn(q, a, _run_id(n)))[-100:]
        cp = samples.v2_checkpoint(AGENT, histories, timestamp=start + timedelta(seconds=f), bulk=2000, tools=30)
        stamp = (start + timedelta(seconds=f)).strftime("%Y%m%d_%H%M%S")
        (cp_dir / f"agent_checkpoint_{stamp}.pkl").write_bytes(samples.dumps(cp))
    obs = root / "Agents" / AGENT / "obs"
    for k in range(max(n - 2, 1), n + 1):  # the obs ring buffer keeps the last 3 runs
        sid = targets[-1]
        run = samples.obs_run(
            _run_id(k),
            AGENT,
            sid,
            f"obs-only run {k}",
            f"answer {k}",
            tools=[("get_weather", {"city": "Berlin"}, "Berlin: 21C")],
        )
        samples.write_obs_run(obs, run)
    return root


def subset(src: Path, dst: Path, files: int) -> Path:
    """The first `files` checkpoints of `src` (hard links) plus its obs dir."""
    cp_src = src / "Agents" / "checkpoint" / AGENT
    cp_dst = dst / "Agents" / "checkpoint" / AGENT
    cp_dst.mkdir(parents=True)
    for p in sorted(cp_src.glob("*.pkl"))[:files]:
        os.link(p, cp_dst / p.name)
    shutil.copytree(src / "Agents" / AGENT, dst / "Agents" / AGENT)
    return dst


def worker(data: Path, store_dir: Path, trace_memory: bool) -> dict:
    """Runs in its own process: ingest `data` into an empty store, on one core."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from flowrl.ingest import ingest_paths
    from flowrl.store.files import TraceStore

    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    summary = ingest_paths([data], TraceStore(store_dir))
    seconds = time.perf_counter() - t0
    heap_peak = tracemalloc.get_traced_memory()[1] if trace_memory else None
    return {
        "files": summary.files_read,
        "read": summary.read,
        "new": summary.new,
        "duplicate": summary.duplicate,
        "skipped": summary.skipped,
        "rejected": summary.rejected_count,
        "seconds": seconds,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "heap_peak_mb": None if heap_peak is None else heap_peak / 2**20,
    }


def run_case(data: Path, tmp: Path, name: str, trace_memory: bool) -> dict:
    store = tmp / f"store-{name.replace('/', '-')}-{int(trace_memory)}"
    out = subprocess.run(
        [sys.executable, __file__, "--worker", str(data), str(store)] + (["--trace-memory"] if trace_memory else []),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--keep", type=Path, default=None, help="build the data here and keep it")
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--trace-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.trace_memory)))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="flowrl-bench-ingest-")) if args.keep is None else args.keep
    try:
        t0 = time.perf_counter()
        full = build(tmp / "snapshots", args.files, args.sessions)
        small = subset(full, tmp / "snapshots-100", min(100, args.files))
        fresh = build(tmp / "all-new", min(100, args.files), args.sessions, all_new=True)
        size = sum(p.stat().st_size for p in (full / "Agents" / "checkpoint" / AGENT).glob("*.pkl"))
        print(
            f"built {args.files} checkpoints x {args.sessions} sessions ({size / 2**20:.0f} MB, "
            f"{size / args.files / 1024:.0f} KB per file) in {time.perf_counter() - t0:.1f} s"
        )
        cases = [
            (f"snapshots/{min(100, args.files)}", small),
            (f"snapshots/{args.files}", full),
            (f"all-new/{min(100, args.files)}", fresh),
        ]
        rows = []
        for name, data in cases:
            r = run_case(data, tmp, name, trace_memory=False)
            r["heap_peak_mb"] = run_case(data, tmp, name, trace_memory=True)["heap_peak_mb"]
            rows.append((name, r))
        header = (
            f"{'case':<18}{'files':>7}{'read':>9}{'new':>7}{'dup':>9}{'skip':>6}{'s':>8}{'files/s':>9}"
            f"{'read/s':>10}{'new/s':>8}{'RSS MB':>8}{'heap MB':>9}"
        )
        print(header)
        print("-" * len(header))
        for name, r in rows:
            s = r["seconds"]
            print(
                f"{name:<18}{r['files']:>7}{r['read']:>9}{r['new']:>7}{r['duplicate']:>9}{r['skipped']:>6}{s:>8.2f}"
                f"{r['files'] / s:>9.0f}{r['read'] / s:>10.0f}{r['new'] / s:>8.0f}{r['maxrss_mb']:>8.0f}"
                f"{r['heap_peak_mb']:>9.1f}"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
