"""Run every benchmark with the settings the README's figures come from (`make bench`).

Each runs in its own process; their tables go to stdout. Takes about 10 minutes on 2 cores. The improvement
benchmark (`bench_improve.py`, about an hour for two rounds) and online GRPO against SFT (`bench_grpo_vs_sft.py`)
run only when named: `python bench/run_all.py improve grpo`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = [
    ("capture", ["bench_capture.py"]),
    ("ingest", ["bench_ingest.py"]),
    ("sandbox", ["bench_sandbox.py"]),
    ("dataset", ["bench_dataset.py"]),
    ("train", ["bench_train.py"]),
    ("backend", ["bench_backend.py"]),
]
ON_REQUEST = [
    (
        "improve",
        [
            "bench_improve.py",
            "--out",
            "bench-improve",
            "--rounds",
            "2",
            "--train-tasks",
            "100",
            "--samples",
            "4",
            "--eval-tasks",
            "150",
            "--temperature",
            "0.7",
            "--epochs",
            "3",
        ],
    ),
    (
        "grpo",
        [
            "bench_grpo_vs_sft.py",
            "--out",
            "bench-grpo-vs-sft",
            "--train-tasks",
            "50",
            "--samples",
            "4",
            "--eval-tasks",
            "150",
            "--temperature",
            "0.7",
            "--epochs",
            "3",
        ],
    ),
]


def main(argv: list[str]) -> int:
    wanted = set(argv) or {name for name, _ in BENCHES}
    failed = []
    for name, args in BENCHES + ON_REQUEST:
        if name not in wanted:
            continue
        print(f"\n## {name}\n", flush=True)
        rc = subprocess.run([sys.executable, str(HERE / args[0]), *args[1:]]).returncode
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
