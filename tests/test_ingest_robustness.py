"""Issue 13: foreign file names never crash `ingest` or `watch`, and a late obs file upgrades its trace.

Both through `flowrl ingest` (library and CLI) and through watch's processing path (`Watcher.run_once`,
which runs the same `process_ready` as the service loop, without sleeping on a debounce: the files are
made old enough first).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

import orjson
import pytest

from flowrl.cli import main
from flowrl.ingest import ingest_paths
from flowrl.ingest.watch import STATE_NAME, Watcher
from flowrl.store.files import TraceStore
from tests.fakes import flowagent_files as samples

AGENT = "agent"
BAD_NAME = "agent_checkpoint_20261399_999999.pkl"  # month 13, day 99, 99:99:99
RUN = "1a7e0001"
Q, A = "Convert 3 km to miles", "3 km is about 1.86 miles."
TOOLS = [("calculator", {"expression": "3 * 0.621371"}, "1.864113")]

# -- helpers ------------------------------------------------------------------------------------------


def _cp_dir(root: Path, agent: str = AGENT) -> Path:
    return root / "Agents" / "checkpoint" / agent


def _obs_dir(root: Path, agent: str = AGENT) -> Path:
    return root / "Agents" / agent / "obs"


def _age(*paths: Path, seconds: float = 60.0) -> None:
    """Make files look written a while ago, so watch reads them on its first look (no debounce wait)."""
    old = time.time() - seconds
    for p in paths:
        os.utime(p, (old, old))


def _once(root: Path, store: TraceStore):
    return Watcher([root], store, debounce=0.0).run_once()


def _write_cp(root: Path, obj, name: str) -> Path:
    path = _cp_dir(root) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(samples.dumps(obj))
    return path


def _one_line(text: str) -> str:
    return " ".join(text.split())


# == 1. a checkpoint file name with an impossible time ================================================


@pytest.mark.parametrize("front", ["library", "cli"])
def test_impossible_time_in_a_checkpoint_name_is_read_with_the_pickled_time(
    front: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    cp = samples.v2_checkpoint(AGENT, {"s": samples.turn(Q, A, RUN)}, timestamp=datetime(2026, 11, 22, 9, 30, 0))
    _write_cp(root, cp, BAD_NAME)
    store = TraceStore(tmp_path / "store")
    if front == "library":
        summary = ingest_paths([root], store)
        assert (summary.new, summary.rejected_count) == (1, 0)
        assert sum(summary.notes.values()) == 1 and "impossible time" in next(iter(summary.notes))
    else:
        assert main(["ingest", str(root), "--store", str(store.root)]) == 0
        assert "1 new" in _one_line(capsys.readouterr().out)
    (trace,) = store.iter_traces()
    assert trace.timestamp == "2026-11-22T09:30:00"  # from the file's contents, not its name
    assert trace.user_query == Q


def test_impossible_time_in_a_checkpoint_name_does_not_crash_watch(tmp_path: Path) -> None:
    root = tmp_path / "data"
    path = _write_cp(root, samples.v2_checkpoint(AGENT, {"s": samples.turn(Q, A, RUN)}), BAD_NAME)
    _age(path)
    store = TraceStore(tmp_path / "store")
    summary = _once(root, store)
    assert (summary.new, summary.rejected_count) == (1, 0)
    assert store.count() == 1
    assert _once(root, store).files_read == 0  # recorded in the state like any other file


def test_bad_name_and_no_pickled_time_falls_back_to_the_file_time(tmp_path: Path) -> None:
    root = tmp_path / "data"
    cp = samples.v2_checkpoint(AGENT, {"s": samples.turn(Q, A, RUN)})
    cp.timestamp = "not a time"
    path = _write_cp(root, cp, "agent_checkpoint_20260230_250000.pkl")  # 30 February, hour 25
    mtime = datetime(2026, 10, 1, 12, 0, 0).timestamp()
    os.utime(path, (mtime, mtime))
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([root], store)
    assert summary.new == 1 and summary.rejected_count == 0
    (trace,) = store.iter_traces()
    assert trace.timestamp.startswith("2026-10-01T12:00:00")
    assert any("modification time" in n for n in summary.notes)


def test_many_bad_names_are_counted_and_warned_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "data"
    for n in range(3):
        history = samples.turn(f"{Q} #{n}", A, f"1a7e010{n}")
        _write_cp(root, samples.v2_checkpoint(AGENT, {"s": history}), f"agent_checkpoint_2026139{n}_99999{n}.pkl")
    with caplog.at_level("WARNING", logger="flowrl"):
        summary = ingest_paths([root], TraceStore(tmp_path / "store"))
    assert summary.new == 3
    assert sum(summary.notes.values()) == 3 and len(summary.notes) == 1
    assert len([r for r in caplog.records if "impossible time" in r.getMessage()]) == 1


def test_impossible_message_and_trace_timestamps_never_reach_the_store(tmp_path: Path) -> None:
    """V1 message timestamps and imported trace files carry dates of their own; a date that cannot be
    would name an impossible day folder in the store."""
    root = tmp_path / "data"
    history = [
        {"role": "user", "content": Q, "timestamp": "2026-13-45T99:00:00"},
        {"role": "assistant", "content": A, "timestamp": "2026-13-45T99:00:01"},
    ]
    v1 = samples.v1_checkpoint(AGENT, {"s": history}, timestamp=datetime(2025, 12, 1, 10, 0, 0))
    _write_cp(root, v1, "agent_checkpoint_20251201_100000.pkl")
    imported = root / "rl_traces" / "2026-11-22"
    imported.mkdir(parents=True)
    (imported / "0123456789ab.json").write_text(
        json.dumps({"trace_id": "0123456789ab", "user_query": "imported", "timestamp": "2026-02-31T10:00:00"})
    )
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([root], store)
    assert summary.new == 2 and summary.rejected_count == 0
    days = sorted(p.parent.name for p in store.iter_paths())
    for day in days:
        datetime.strptime(day, "%Y-%m-%d")  # every day folder is a real date
    by_query = {t.user_query: t for t in store.iter_traces()}
    assert by_query[Q].timestamp == "2025-12-01T10:00:00"  # the checkpoint's time
    datetime.fromisoformat(by_query["imported"].timestamp)


@pytest.mark.parametrize("front", ["ingest", "watch"])
def test_file_names_that_are_not_utf8_do_not_crash(front: str, tmp_path: Path) -> None:
    """A name with bytes that are not UTF-8 reaches flowrl as a str with surrogates: JSON (the trace's
    metadata, watch's state file) cannot hold those."""
    root = tmp_path / "data"
    obs = _obs_dir(root)
    obs.mkdir(parents=True)
    run = samples.obs_run(RUN, AGENT, "s", Q, A, tools=TOOLS)
    name = os.fsdecode(b"run_\xff\xfe.json")
    (obs / name).write_text(json.dumps(run))
    explicit = tmp_path / os.fsdecode(b"agent_checkpoint_\xff.pkl")
    explicit.write_bytes(samples.dumps(samples.v2_checkpoint("other", {"s": samples.turn("q2", "a2", "2b000001")})))
    _age(obs / name, explicit)
    store = TraceStore(tmp_path / "store")
    if front == "ingest":
        summary = ingest_paths([root, explicit], store)
    else:
        summary = Watcher([root, explicit], store, debounce=0.0).run_once()
        orjson.loads((store.root / STATE_NAME).read_bytes())
    assert (summary.new, summary.rejected_count) == (2, 0)
    for trace in store.iter_traces():
        orjson.dumps(trace.model_dump(mode="json"))


def test_a_fifo_with_a_checkpoint_name_is_rejected_not_waited_on(tmp_path: Path) -> None:
    root = tmp_path / "data"
    cp = _cp_dir(root)
    cp.mkdir(parents=True)
    os.mkfifo(cp / "agent_checkpoint_20261122_100000.pkl")
    summary = ingest_paths([root], TraceStore(tmp_path / "store"))
    assert summary.rejected_count == 1 and "not a regular file" in summary.rejected[0].reason


@pytest.mark.parametrize("front", ["ingest", "watch"])
def test_a_failure_of_flowrls_own_on_one_file_is_a_rejection_not_a_crash(
    front: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same class of bug in a parser not found yet: one file is reported, the rest is ingested."""
    import flowrl.ingest.engine as engine

    real = engine.split_turns

    def split_turns(history):
        if history.session_id == "cursed":
            raise ValueError("day is out of range for month")
        return real(history)

    monkeypatch.setattr(engine, "split_turns", split_turns)
    root = tmp_path / "data"
    good = _write_cp(
        root, samples.v2_checkpoint(AGENT, {"s": samples.turn(Q, A, RUN)}), "agent_checkpoint_20261122_100000.pkl"
    )
    bad = _write_cp(
        root,
        samples.v2_checkpoint(AGENT, {"cursed": samples.turn("q", "a", "2b000002")}),
        "agent_checkpoint_20261122_110000.pkl",
    )
    _age(good, bad)
    store = TraceStore(tmp_path / "store")
    summary = ingest_paths([root], store) if front == "ingest" else _once(root, store)
    assert (summary.new, summary.rejected_count) == (1, 1)
    assert "flowrl failed on this file (ValueError" in summary.rejected[0].reason
    assert bad.name in summary.rejected[0].reason


# == 2. a late obs file upgrades the text-only trace of its run =======================================


def _late_obs_setup(root: Path) -> tuple[Path, Path]:
    cp = _write_cp(
        root, samples.v2_checkpoint(AGENT, {"s": samples.turn(Q, A, RUN)}), "agent_checkpoint_20261122_100000.pkl"
    )
    run = samples.obs_run(RUN, AGENT, "s", Q, A, tools=TOOLS, tokens=(120, 30))
    staged = root.parent / "obs-later" / f"run_{RUN}.json"
    staged.parent.mkdir(parents=True)
    staged.write_text(json.dumps(run))
    return cp, staged


def _arrive(staged: Path, root: Path) -> Path:
    target = _obs_dir(root) / staged.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staged), target)
    return target


def _assert_upgraded(store: TraceStore, trace_id: str) -> None:
    assert store.count() == 1
    t = store.get(trace_id)
    assert [c.tool_name for c in t.tool_calls] == ["calculator"]
    assert (t.total_tokens_in, t.total_tokens_out) == (240, 60)
    assert t.success is True
    assert any(m.get("role") == "tool" for m in t.messages)
    assert t.facts is not None and t.facts.tools  # facts follow the new tool calls


def test_late_obs_file_upgrades_the_checkpoint_trace_in_place(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _cp, staged = _late_obs_setup(root)
    store = TraceStore(tmp_path / "store")
    assert ingest_paths([root], store).new == 1
    (poor,) = store.iter_traces()
    assert poor.tool_calls == [] and poor.success is None and poor.total_tokens_in is None
    store.label(poor.trace_id, False, notes="wrong unit, checked by hand")

    _arrive(staged, root)
    summary = ingest_paths([root], store)
    assert (summary.new, summary.upgraded) == (0, 1)
    _assert_upgraded(store, poor.trace_id)
    rich = store.get(poor.trace_id)
    assert (rich.label, rich.label_source, rich.manual_review, rich.review_notes) == (
        False,
        "manual",
        True,
        "wrong unit, checked by hand",
    )
    assert store.find(poor.trace_id) == store.find(rich.trace_id)

    # idempotent: the same files again change nothing, not even the file
    path = store.find(poor.trace_id)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    again = ingest_paths([root], store)
    assert (again.new, again.upgraded, again.duplicate) == (0, 0, again.read)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert store.count() == 1


def test_late_obs_file_via_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "data"
    _cp, staged = _late_obs_setup(root)
    args = ["ingest", str(root), "--store", str(tmp_path / "store")]
    assert main(args) == 0
    store = TraceStore(tmp_path / "store")
    (poor,) = store.iter_traces()
    _arrive(staged, root)
    assert main(args) == 0
    capsys.readouterr()
    _assert_upgraded(store, poor.trace_id)


def test_late_obs_file_upgrades_the_trace_while_watching(tmp_path: Path) -> None:
    root = tmp_path / "data"
    cp, staged = _late_obs_setup(root)
    _age(cp)
    store = TraceStore(tmp_path / "store")
    watcher = Watcher([root], store, debounce=0.0)
    assert watcher.run_once().new == 1
    (poor,) = store.iter_traces()
    store.label(poor.trace_id, True, notes="good")

    _age(_arrive(staged, root))
    summary = watcher.run_once()  # the same watcher: the trace id is in its memory too
    assert (summary.new, summary.upgraded) == (1, 1)  # the summary is cumulative over the session
    _assert_upgraded(store, poor.trace_id)
    assert (store.get(poor.trace_id).label, store.get(poor.trace_id).review_notes) == (True, "good")

    # a restarted watcher reads nothing again; one without state re-reads and changes nothing
    assert _once(root, store).files_read == 0
    (store.root / STATE_NAME).unlink()
    path = store.find(poor.trace_id)
    before = path.read_bytes()
    fresh = _once(root, store)
    assert (fresh.new, fresh.upgraded) == (0, 0) and path.read_bytes() == before


def test_late_obs_file_after_a_watch_restart(tmp_path: Path) -> None:
    root = tmp_path / "data"
    cp, staged = _late_obs_setup(root)
    _age(cp)
    store = TraceStore(tmp_path / "store")
    assert _once(root, store).new == 1
    (poor,) = store.iter_traces()
    _age(_arrive(staged, root))
    summary = _once(root, store)
    assert (summary.new, summary.upgraded, summary.files_read) == (0, 1, 1)
    _assert_upgraded(store, poor.trace_id)


def test_upgrade_keeps_host_annotations_and_drops_stale_scores(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _cp, staged = _late_obs_setup(root)
    store = TraceStore(tmp_path / "store")
    ingest_paths([root], store)
    (poor,) = store.iter_traces()

    def annotate(t) -> None:
        t.group_key = "unit-conversion"
        t.metadata["reference_answer"] = "1.86 miles"
        t.rewards = {"tool_success": None}
        t.reward_score = 0.4
        t.label, t.label_source = False, "engine"
        t.written_by_a_newer_flowrl = {"kept": True}

    store.modify(poor.trace_id, annotate)
    _arrive(staged, root)
    assert ingest_paths([root], store).upgraded == 1
    t = store.get(poor.trace_id)
    assert t.group_key == "unit-conversion" and t.metadata["reference_answer"] == "1.86 miles"
    assert t.written_by_a_newer_flowrl == {"kept": True}
    assert t.facts.reference_answer == "1.86 miles"
    # scores computed on the text-only trace no longer describe it: `flowrl score` computes them again
    assert (t.rewards, t.reward_score, t.label, t.label_source) == ({}, None, None, None)
    assert t.metadata["flowagent"]["upgraded_from"] == "chat_history"


def test_richer_trace_never_downgraded_by_a_later_text_only_snapshot(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _cp, staged = _late_obs_setup(root)
    _arrive(staged, root)
    store = TraceStore(tmp_path / "store")
    assert ingest_paths([root], store).new == 1
    shutil.rmtree(_obs_dir(root))  # obs rotated the run out; a later snapshot still holds the turn
    _write_cp(
        root, samples.v2_checkpoint(AGENT, {"s": samples.turn(Q, A, RUN)}), "agent_checkpoint_20261122_110000.pkl"
    )
    summary = ingest_paths([root], store)
    assert (summary.new, summary.upgraded) == (0, 0)
    (t,) = store.iter_traces()
    assert [c.tool_name for c in t.tool_calls] == ["calculator"]


def test_real_fixture_checkpoints_first_then_obs(flowagent_fixtures: Path, tmp_path: Path) -> None:
    agents = tmp_path / "data" / "Agents"
    shutil.copytree(flowagent_fixtures / "tb_data_dir" / ".data" / "main-vm" / "Agents", agents)
    obs = agents / "sample_agent" / "obs"
    shutil.move(str(obs), tmp_path / "obs-later")
    store = TraceStore(tmp_path / "store")
    assert ingest_paths([agents], store).new == 3
    assert all(t.tool_calls == [] for t in store.iter_traces())
    shutil.move(str(tmp_path / "obs-later"), obs)
    summary = ingest_paths([agents], store)
    assert (summary.new, summary.upgraded) == (0, 3) and store.count() == 3
    together = TraceStore(tmp_path / "together")
    ingest_paths([agents], together)
    for t in together.iter_traces():
        u = store.get(t.trace_id)
        assert (u.tool_calls, u.total_tokens_in, u.success, u.messages) == (
            t.tool_calls,
            t.total_tokens_in,
            t.success,
            t.messages,
        )
