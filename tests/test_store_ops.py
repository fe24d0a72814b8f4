"""The store when shared: problems per operation, label and score writes that cannot lose each other, an
index that makes `find` O(1), and nothing from tests/ at run time (demo fixtures ship as package data)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import tomllib
from importlib.resources import as_file
from pathlib import Path

import pytest

import flowrl
from flowrl.data import DatasetPipeline, KTODatasetBuilder
from flowrl.data.synthetic import write_synthetic_store
from flowrl.store.files import TraceStore
from flowrl.trace.schema import ExecutionTrace

REPO = Path(__file__).resolve().parents[1]


def _broken(store: TraceStore, name: str = "broken") -> Path:
    day = store.root / "2026-11-21"
    day.mkdir(parents=True, exist_ok=True)
    path = day / f"{name}.json"
    path.write_text('{"trace_id": "broken", "tool_calls": [')
    return path


def _age(root: Path) -> None:
    """Make every folder of the store look written a minute ago (past the index's racy window)."""
    old = (os.stat(root).st_mtime_ns - 60 * 10**9,) * 2
    for p in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(p, ns=old)


# -- problems per operation ------------------------------------------------------------------------
def test_problems_belong_to_the_operation_that_read_them(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(trace_id="ok", user_query="q", timestamp="2026-11-21T00:00:00"))
    broken = _broken(store)
    assert len(list(store.iter_traces())) == 1 and [p.path for p in store.problems] == [broken]
    broken.unlink()
    assert len(list(store.iter_traces())) == 1 and store.problems == []  # the earlier listing's are gone
    _broken(store)
    with store.operation() as op:
        list(store.iter_traces())
        list(store.iter_traces(agent="nobody"))
    assert [p.path.name for p in op] == ["broken.json"] and store.problems == op


def test_a_build_reports_only_its_own_problems(tmp_path: Path) -> None:
    store = TraceStore(write_synthetic_store(tmp_path / "store", 40, n_tasks=8))
    broken = _broken(store, "earlier")
    list(store.iter_traces())
    broken.unlink()
    result = DatasetPipeline(KTODatasetBuilder()).build(store, tmp_path / "out")
    assert result.problems == [] and result.stats.unreadable == 0


def test_a_broken_file_read_twice_is_one_problem(tmp_path: Path) -> None:
    store = TraceStore(write_synthetic_store(tmp_path / "store", 40, n_tasks=8))
    _broken(store)

    def embed(texts: list[str]) -> list[list[float]]:
        return [[1.0, float(len(t))] for t in texts]

    pipe = DatasetPipeline(KTODatasetBuilder(), group_by="embedding", embedder=embed)
    result = pipe.build(store, tmp_path / "out")  # two passes: the embedding fit, then the rows
    assert [p.path.name for p in result.problems] == ["broken.json"]
    with store.operation() as op:
        list(store.iter_traces())
        list(store.iter_traces())
    assert len(op) == 1


# -- label and score writes --------------------------------------------------------------------------
def _scored(trace: ExecutionTrace, value: float) -> ExecutionTrace:
    """What `flowrl score` does to the copy it read (rewards/scoring.py `apply_results`)."""
    trace.rewards = {"r": value}
    trace.reward_score = value
    trace.label, trace.label_source = value >= 0.6, "engine"
    return trace


def test_a_score_written_from_a_copy_read_before_a_label_keeps_the_label(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(trace_id="t", user_query="q"))
    copy = store.get("t")  # flowrl score reads ...
    store.label("t", False, "wrong answer")  # ... a person labels meanwhile ...
    store.update(_scored(copy, 0.9))  # ... and the score is written back
    got = store.get("t")
    assert (got.label, got.label_source, got.review_notes) == (False, "manual", "wrong answer")
    assert got.reward_score == 0.9 and got.rewards == {"r": 0.9}


def test_racing_label_and_score_writes_both_survive(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    ids = [f"t{i}" for i in range(30)]
    for tid in ids:
        store.write(ExecutionTrace(trace_id=tid, user_query=tid))
    for tid in ids:
        start = threading.Barrier(2)

        def score(tid: str = tid, start: threading.Barrier = start) -> None:
            copy = store.get(tid)
            start.wait()
            store.update(_scored(copy, 0.2))

        def label(tid: str = tid, start: threading.Barrier = start) -> None:
            start.wait()
            store.label(tid, True)

        threads = [threading.Thread(target=score), threading.Thread(target=label)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for tid in ids:
        got = store.get(tid)
        assert (got.label, got.label_source, got.reward_score) == (True, "manual", 0.2), tid


_INCREMENT = """
import sys
from flowrl.store.files import TraceStore
store = TraceStore(sys.argv[1])
def bump(t):
    t.metadata["n"] = t.metadata.get("n", 0) + 1
for _ in range(int(sys.argv[2])):
    store.modify("t", bump)
"""


def test_modify_is_atomic_across_threads_and_processes(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(trace_id="t", user_query="q"))
    procs = [subprocess.Popen([sys.executable, "-c", _INCREMENT, str(tmp_path), "40"]) for _ in range(2)]

    def bump(t: ExecutionTrace) -> None:
        t.metadata["n"] = t.metadata.get("n", 0) + 1

    threads = [threading.Thread(target=lambda: [store.modify("t", bump) for _ in range(20)]) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert store.get("t").metadata["n"] == 2 * 40 + 3 * 20  # no read-modify-write lost another's


# -- the index behind find() -------------------------------------------------------------------------
@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every directory listing made, by `os.listdir`, `os.scandir` or `Path.iterdir`."""
    seen: list[str] = []
    real_listdir, real_scandir, real_iterdir = os.listdir, os.scandir, Path.iterdir

    def listdir(path: object = ".") -> list[str]:
        seen.append(str(path))
        return real_listdir(path)  # type: ignore[arg-type]

    def scandir(path: object = ".") -> object:
        seen.append(str(path))
        return real_scandir(path)  # type: ignore[arg-type]

    def iterdir(self: Path) -> object:
        seen.append(str(self))
        return real_iterdir(self)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    return seen


def test_find_lists_the_store_once_then_answers_from_the_index(tmp_path: Path, listings: list[str]) -> None:
    writer = TraceStore(tmp_path)
    for day in range(1, 21):
        writer.write(ExecutionTrace(trace_id=f"d{day}", user_query="q", timestamp=f"2026-11-{day:02d}T00:00:00"))
    _age(tmp_path)
    store = TraceStore(tmp_path)
    listings.clear()
    assert store.find("d3") == tmp_path / "2026-11-03" / "d3.json"
    first = len(listings)
    assert first > 0
    for _ in range(50):
        assert store.find("d17") is not None and store.find("nope") is None and store.exists("d1")
    assert len(listings) == first  # hits and misses alike: no folder listed again
    store.write(ExecutionTrace(trace_id="mine", user_query="q", timestamp="2026-11-05T00:00:00"))
    assert store.find("mine") == tmp_path / "2026-11-05" / "mine.json" and len(listings) == first


def test_a_miss_sees_what_another_process_wrote(tmp_path: Path) -> None:
    store = TraceStore(tmp_path)
    store.write(ExecutionTrace(trace_id="a", user_query="q", timestamp="2026-11-01T00:00:00"))
    assert store.find("b") is None
    TraceStore(tmp_path).write(ExecutionTrace(trace_id="b", user_query="q", timestamp="2026-11-01T00:00:00"))
    assert store.find("b") == tmp_path / "2026-11-01" / "b.json"
    (tmp_path / "2026-11-01" / "b.json").unlink()  # deleted by hand: not found any more
    assert store.find("b") is None


def test_ingest_lists_the_store_a_bounded_number_of_times(tmp_path: Path, listings: list[str]) -> None:
    from flowrl.ingest import ingest_paths

    store = TraceStore(write_synthetic_store(tmp_path / "store", 60, n_tasks=10))
    _age(store.root)
    data = REPO / "tests" / "fixtures" / "flowagent-0.1.28" / "tb_data_dir"
    listings.clear()
    summary = ingest_paths([data], store)
    assert summary.read == 9 and summary.new == 3
    in_store = [p for p in listings if Path(p).is_relative_to(store.root)]
    days = len([p for p in store.root.iterdir() if p.is_dir() and p.name[:2] == "20"])
    assert len(in_store) <= 1 + days  # one listing of the store, not one per turn


# -- nothing from tests/ at run time -------------------------------------------------------------
def test_demo_fixtures_ship_inside_the_package(tmp_path: Path) -> None:
    from flowrl.demo.run import Demo, DemoConfig, flowagent_fixtures

    package = Path(flowrl.__file__).resolve().parent
    with as_file(flowagent_fixtures()) as data:
        data = Path(data).resolve()
        assert data.is_relative_to(package) and "tests" not in data.relative_to(package).parts
        shipped = sorted(p for p in data.rglob("*") if p.is_file())
    assert len(shipped) == 6 and sum(p.stat().st_size for p in shipped) < 100_000
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["flowrl"]
    packaged = {p.resolve() for pattern in patterns for p in package.glob(pattern)}
    assert set(shipped) <= packaged, "pyproject's package-data leaves a demo fixture out of the wheel"
    originals = REPO / "tests" / "fixtures" / "flowagent-0.1.28" / "tb_data_dir" / ".data" / "main-vm"
    for path in shipped:  # the same bytes as the tests' copy of the real FlowAgent capture
        assert path.read_bytes() == (originals / path.relative_to(data)).read_bytes(), path
    summary, _ = Demo(DemoConfig(out=tmp_path / "demo")).stage_ingest()
    assert "new 3" in summary


def test_nothing_in_flowrl_patches_sys_modules() -> None:
    patch = re.compile(r"sys\.modules\[[^\]]*\]\s*=(?!=)|sys\.modules\.(setdefault|update|pop)\(|del\s+sys\.modules")
    offenders = [
        f"{p.relative_to(REPO)}:{n}"
        for p in (REPO / "flowrl").rglob("*.py")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if patch.search(line)
    ]
    assert offenders == []
    assert not (REPO / "flowrl" / "ingest" / "samples.py").exists()
