"""`flowrl score` and score_store end to end on a temporary store."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.rewards.base import Reward, RewardResult
from flowrl.rewards.engine import RewardEngine
from flowrl.rewards.scoring import apply_results, pack, score_store
from flowrl.store.files import TraceStore
from flowrl.trace.load import load_trace
from flowrl.trace.schema import ExecutionTrace, ToolCallTrace

FIXTURES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering"
NAMES = ["syntax", "tool_success", "task_completion", "efficiency", "format", "reference_answer", "host_outcome"]


def fill_store(root: Path) -> TraceStore:
    store = TraceStore(root)
    for path in sorted((FIXTURES / "rl_traces").glob("*/*.json")):
        store.write(load_trace(json.loads(path.read_text()), origin=str(path)))
    ctx = json.loads((FIXTURES / "execution_contexts.json").read_text())["run2_research"]
    store.write(
        ExecutionTrace(
            trace_id="obs-abb7cda3",
            timestamp="2026-11-22T16:50:57",
            user_query=ctx["query"],
            messages=ctx["working_history"],
            status=ctx["status"],
            source="obs",
        )
    )
    # a clean, successful run that a reviewer nevertheless marked bad
    store.write(
        ExecutionTrace(
            trace_id="manual-bad",
            timestamp="2026-11-23T09:00:00",
            user_query="2+2?",
            final_response="4",
            success=True,
            tool_calls=[ToolCallTrace(tool_name="calc", arguments={"e": "2+2"}, result="4")],
        )
    )
    store.label("manual-bad", False, "wrong tone")
    return store


def config(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "rewards.toml"
    path.write_text("[rewards.code_execution]\nenabled = false\n" + body)
    return path


def test_score_command_end_to_end(tmp_path, capsys):
    store = fill_store(tmp_path / "store")
    rc = main(["score", "--store", str(store.root), "--config", str(config(tmp_path)), "--workers", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "scored 5 of 5 traces" in out
    for name in NAMES + ["combined"]:
        assert name in out
    assert "labels:" in out and "1 manual labels kept" in out

    traces = {t.trace_id: t for t in store.iter_traces()}
    for t in traces.values():
        assert set(t.rewards) == set(NAMES)
        assert set(t.reward_details) == set(NAMES)
        assert t.reward_score is not None
    good = traces["0498911e921f"]
    assert good.reward_score == 1.0 and good.label is True and good.label_source == "engine"
    failed = traces["2a86d8ba994f"]
    assert failed.rewards["tool_success"] == pytest.approx(2 / 3) and failed.rewards["task_completion"] == 0.0
    assert failed.rewards["syntax"] is None and failed.reward_details["syntax"]["reason"]
    assert failed.label is False  # 0.57 < 0.6
    assert traces["obs-abb7cda3"].rewards["task_completion"] == 0.0  # final_answer(success=false)
    manual = traces["manual-bad"]
    assert manual.reward_score > 0.9
    assert manual.label is False and manual.label_source == "manual" and manual.review_notes == "wrong tone"
    assert not any((store.root / ".staging").iterdir())  # every write went through and was moved into place


def test_second_run_scores_only_new_traces_and_all_rescoring(tmp_path, capsys):
    store = fill_store(tmp_path / "store")
    cfg = str(config(tmp_path))
    assert main(["score", "--store", str(store.root), "--config", cfg]) == 0
    capsys.readouterr()
    assert main(["score", "--store", str(store.root), "--config", cfg]) == 0
    assert "scored 0 of 5 traces" in capsys.readouterr().out
    store.write(ExecutionTrace(trace_id="new-one", final_response="hello"))
    assert main(["score", "--store", str(store.root), "--config", cfg]) == 0
    assert "scored 1 of 6 traces" in capsys.readouterr().out
    assert main(["score", "--store", str(store.root), "--config", cfg, "--all"]) == 0
    assert "scored 6 of 6 traces" in capsys.readouterr().out
    assert store.get("manual-bad").label is False


def test_enabling_a_reward_rescores_traces_that_lack_it(tmp_path):
    store = fill_store(tmp_path / "store")
    engine = RewardEngine.from_config(config(tmp_path, "[rewards.format]\nenabled = false\n"))
    assert score_store(store, engine).scored == 5
    engine = RewardEngine.from_config(config(tmp_path))
    assert score_store(store, engine).scored == 5  # format is missing everywhere
    assert score_store(store, engine).scored == 0


def test_bad_config_is_one_clear_error(tmp_path, capsys):
    store = fill_store(tmp_path / "store")
    bad = tmp_path / "bad.toml"
    bad.write_text("[rewards.syntax]\nweight = -2\n")
    assert main(["score", "--store", str(store.root), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowrl: error: ") and str(bad) in err and "rewards.syntax.weight" in err
    assert main(["score", "--store", str(store.root), "--config", str(tmp_path / "missing.toml")]) == 2
    assert "no such reward config file" in capsys.readouterr().err


def test_missing_store_is_one_clear_error(tmp_path, capsys):
    assert main(["score", "--store", str(tmp_path / "nothing"), "--config", str(config(tmp_path))]) == 2
    assert "flowrl ingest" in capsys.readouterr().err


def test_corrupt_file_is_named_and_skipped(tmp_path, capsys):
    store = fill_store(tmp_path / "store")
    (store.root / "2026-11-22" / "broken.json").write_text("{not json")
    assert main(["score", "--store", str(store.root), "--config", str(config(tmp_path))]) == 0
    captured = capsys.readouterr()
    assert "scored 5 of 5" in captured.out and "broken.json" in captured.err


class Counting(Reward):
    name = "counting"

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.lock = threading.Lock()

    def score_batch(self, traces):
        traces = list(traces)
        with self.lock:
            self.batches.append(len(traces))
        return [RewardResult(0.7) for _ in traces]


def test_score_store_library_progress_and_batches(tmp_path):
    store = fill_store(tmp_path / "store")
    reward = Counting()
    calls: list[tuple[int, int]] = []
    summary = score_store(
        store,
        RewardEngine({"counting": reward}, {"counting": 1.0}),
        progress=lambda d, t: calls.append((d, t)),
        workers=3,
        batch_size=2,
    )
    assert summary.scored == 5 and summary.failed == 0
    assert calls[0] == (0, 5) and calls[-1] == (5, 5)
    assert sum(reward.batches) == 5 and max(reward.batches) <= 2 + 1
    assert summary.rewards["counting"].mean == pytest.approx(0.7)
    assert (summary.good, summary.bad) == (4, 1)  # the manual "bad" stays bad
    assert summary.manual_kept == 1


def test_apply_results_never_overwrites_a_manual_label():
    engine = RewardEngine({"a": Counting()}, {"a": 1.0})
    t = ExecutionTrace(label=True, label_source="manual", manual_review=True)
    apply_results(t, {"a": RewardResult(0.1)}, engine)
    assert t.label is True and t.label_source == "manual" and t.reward_score == pytest.approx(0.1)
    toolbox = ExecutionTrace(label=False, manual_review=True)  # toolboxv2's own manual label
    apply_results(toolbox, {"a": RewardResult(0.9)}, engine)
    assert toolbox.label is False
    engine_label = ExecutionTrace(label=True, label_source="engine")
    apply_results(engine_label, {"a": RewardResult(None)}, engine)
    assert engine_label.label is None and engine_label.label_source is None


def test_learned_reward_trains_on_the_stores_manual_labels(tmp_path, capsys):
    pytest.importorskip("numpy")
    store = TraceStore(tmp_path / "store")
    for i in range(12):
        good = i % 2 == 0
        store.write(ExecutionTrace(trace_id=f"t{i}", final_response="done" if good else "Error: failed", success=good))
        store.label(f"t{i}", good)
    cfg = config(tmp_path, "[rewards.learned]\nmin_labels = 6\nmin_per_class = 2\nmodel = 'learned.json'\n")
    assert main(["score", "--store", str(store.root), "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "learned: trained on 12 manual labels" in out
    assert (tmp_path / "learned.json").is_file()
    assert store.get("t0").rewards["learned"] > 0.5 > store.get("t1").rewards["learned"]


class _Judge(BaseHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = body["messages"][-1]["content"]
        _Judge.requests.append(user)
        n = user.count("<trajectory id=")
        content = json.dumps({"scores": [{"trajectory_id": str(i), "score": 0.5} for i in range(1, n + 1)]})
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_judge_in_a_store_run_sees_each_task_group_once(tmp_path, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "FLOWRL_JUDGE_MODEL"):
        monkeypatch.delenv(name, raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    _Judge.requests = []
    try:
        store = TraceStore(tmp_path / "store")
        for i in range(9):  # three tasks, three tries each, interleaved in the store
            store.write(ExecutionTrace(trace_id=f"t{i}", user_query=f"task {i % 3}", final_response=f"answer {i}"))
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        cfg = config(tmp_path, f"[rewards.judge]\nmodel = 'm'\nbase_url = '{url}'\n")
        summary = score_store(store, RewardEngine.from_config(cfg), workers=2, batch_size=2)
    finally:
        server.shutdown()
        server.server_close()
    assert summary.scored == 9 and summary.rewards["judge"].values == 9
    assert len(_Judge.requests) == 3
    assert all(r.count("<trajectory id=") == 3 for r in _Judge.requests)


class _ListBackend:
    """A ScoringBackend over a plain list of traces: what `score_store` asks of a backend, and nothing more."""

    def __init__(self, traces: list[ExecutionTrace]) -> None:
        self.traces = {t.trace_id: t for t in traces}
        self.batches: list[list[str]] = []

    def select(self, store, problems, pick):
        problems.append("one unreadable entry")
        return ((t, t.trace_id) for t in self.traces.values() if pick(t))

    def compute(self, work):
        for ids in pack(work.todo, work.batch_size):
            self.batches.append(ids)
            yield [(i, r, None) for i, r in zip(ids, work.engine.compute_batch([self.traces[i] for i in ids]))]

    def reread(self, store, key):
        return store.get(key)


def test_score_store_counts_and_writes_what_any_backend_computes(tmp_path):
    store = fill_store(tmp_path / "store")
    engine = RewardEngine.from_config(config(tmp_path))
    backend = _ListBackend(list(store.iter_traces()))
    summary = score_store(store, engine, batch_size=3, backend=backend)
    assert summary.scored == summary.seen == len(backend.traces) and summary.problems == ["one unreadable entry"]
    assert sorted(i for b in backend.batches for i in b) == sorted(backend.traces)
    assert all(set(NAMES) <= set(t.rewards) for t in store.iter_traces())
    assert store.get("manual-bad").label is False  # a manual label stays
    assert score_store(store, engine, backend=_ListBackend(list(store.iter_traces()))).skipped == summary.seen
