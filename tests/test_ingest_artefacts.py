"""Checkpoint artefacts (reference §3.6) on checkpoints the tests create: auto-resume, lag, truncation,
identical queries, incomplete commits, sidecar questions, and V1 checkpoints."""

from __future__ import annotations

from pathlib import Path

from flowrl.ingest import CheckpointLoader, ingest_paths
from flowrl.store.files import TraceStore
from tests.fakes import flowagent_files as samples

AGENT = "agent"
Q1, A1 = "Weather in Paris?", "Paris: 18C, cloudy."
Q2, A2 = "And in Rome?", "Rome: 25C sunny."
RUN = "5eed0001"


def _cp_dir(root: Path) -> Path:
    return root / "Agents" / "checkpoint" / AGENT


def _obs_dir(root: Path) -> Path:
    return root / "Agents" / AGENT / "obs"


def _resumed_history() -> list[dict]:
    # What chat_history holds after an auto-resume: the ORIGINAL query again, same run id, new answer.
    return samples.turn(Q1, A1, RUN) + samples.turn(Q1, A2, RUN)


def _pairs(traces) -> set[tuple[str, str]]:
    return {(t.user_query, t.final_response) for t in traces}


def test_auto_resumed_turn_gets_the_real_follow_up_query_from_obs(tmp_path: Path) -> None:
    samples.write_checkpoint(_cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": _resumed_history()}))
    samples.write_obs_run(
        _obs_dir(tmp_path),
        samples.obs_run(
            RUN,
            AGENT,
            "s",
            Q1,
            A1,
            tools=[("get_weather", {"city": "Paris"}, "Paris: 18C, cloudy")],
            followups=[(Q2, A2, [("get_weather", {"city": "Rome"}, "Rome: 25C, sunny")])],
        ),
    )
    traces = CheckpointLoader(tmp_path).load()
    assert _pairs(traces) == {(Q1, A1), (Q2, A2)}
    by_query = {t.user_query: t for t in traces}
    assert [c.arguments for c in by_query[Q1].tool_calls] == [{"city": "Paris"}]
    assert [c.arguments for c in by_query[Q2].tool_calls] == [{"city": "Rome"}]
    assert by_query[Q2].metadata["flowagent"]["auto_resumed"] is True
    assert by_query[Q2].messages[-5]["content"].startswith("Continue with old task")
    assert by_query[Q2].messages[-4] == {"role": "user", "content": Q2}
    assert all(t.source == "checkpoint" and t.run_id == RUN for t in traces)
    assert (by_query[Q2].total_tokens_in, by_query[Q2].llm_calls_count) == (200, 2)  # its own steps only


def test_auto_resumed_turn_without_obs_is_skipped_never_mislabelled(tmp_path: Path) -> None:
    samples.write_checkpoint(_cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": _resumed_history()}))
    loader = CheckpointLoader(tmp_path)
    assert _pairs(loader.load()) == {(Q1, A1)}  # never (Q1, A2): that query would be wrong
    assert loader.summary.skipped == 1
    assert any("auto-resumed" in r for r in loader.summary.skip_reasons)


def test_resumed_obs_run_alone_gives_both_turns(tmp_path: Path) -> None:
    samples.write_obs_run(_obs_dir(tmp_path), samples.obs_run(RUN, AGENT, "s", Q1, A1, followups=[(Q2, A2, [])]))
    traces = CheckpointLoader(tmp_path).load()
    assert _pairs(traces) == {(Q1, A1), (Q2, A2)}
    assert {t.source for t in traces} == {"obs"}


def test_resumed_run_seen_first_in_obs_then_in_checkpoints_is_not_duplicated(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    src = tmp_path / "in"
    samples.write_obs_run(_obs_dir(src), samples.obs_run(RUN, AGENT, "s", Q1, A1, followups=[(Q2, A2, [])]))
    assert ingest_paths([src], store).new == 2
    samples.write_checkpoint(_cp_dir(src), samples.v2_checkpoint(AGENT, {"s": _resumed_history()}))
    again = ingest_paths([src], store)
    assert again.new == 0 and again.skipped == 0 and store.count() == 2


def test_lag_the_newest_run_is_missing_from_the_checkpoint(tmp_path: Path) -> None:
    """The checkpoint written at the end of a run usually lacks it (background commit); obs has it."""
    store = TraceStore(tmp_path / "store")
    src = tmp_path / "in"
    samples.write_checkpoint(
        _cp_dir(src), samples.v2_checkpoint(AGENT, {"s": samples.turn(Q1, A1, "11110001")}), stamp="20261122_100000"
    )
    samples.write_obs_run(_obs_dir(src), samples.obs_run("11110001", AGENT, "s", Q1, A1))
    samples.write_obs_run(_obs_dir(src), samples.obs_run("11110002", AGENT, "s", Q2, A2))
    first = ingest_paths([src], store)
    assert first.new == 2 and first.new_by_source == {"checkpoint": 1, "obs": 1}
    history = samples.turn(Q1, A1, "11110001") + samples.turn(Q2, A2, "11110002")
    samples.write_checkpoint(_cp_dir(src), samples.v2_checkpoint(AGENT, {"s": history}), stamp="20261122_100100")
    assert ingest_paths([src], store).new == 0
    assert _pairs(store.iter_traces()) == {(Q1, A1), (Q2, A2)}


def test_identical_queries_in_one_session_are_separate_turns(tmp_path: Path) -> None:
    history = samples.turn("status?", "all good", "aaaa0001") + samples.turn("status?", "all good", "aaaa0002")
    history += [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}] * 2  # no run ids
    samples.write_checkpoint(_cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": history}))
    store = TraceStore(tmp_path / "store")
    assert ingest_paths([tmp_path / "Agents"], store).new == 4
    assert ingest_paths([tmp_path / "Agents"], store).new == 0


def test_incomplete_commit_and_sidecar_question_are_not_turns(tmp_path: Path) -> None:
    store = TraceStore(tmp_path / "store")
    sidecar = [{"role": "user", "content": "Is it done yet?"}]
    partial = samples.turn(Q2, A2, "bbbb0002")[:2]  # user + RUN SUMMARY, the answer not yet appended
    samples.write_checkpoint(
        _cp_dir(tmp_path),
        samples.v2_checkpoint(AGENT, {"s": sidecar + samples.turn(Q1, A1, "bbbb0001") + partial}),
        stamp="20261122_100000",
    )
    summary = ingest_paths([tmp_path / "Agents"], store)
    assert summary.new == 1 and summary.skipped == 2
    assert _pairs(store.iter_traces()) == {(Q1, A1)}
    samples.write_checkpoint(
        _cp_dir(tmp_path),
        samples.v2_checkpoint(
            AGENT, {"s": sidecar + samples.turn(Q1, A1, "bbbb0001") + samples.turn(Q2, A2, "bbbb0002")}
        ),
        stamp="20261122_100100",
    )
    assert ingest_paths([tmp_path / "Agents"], store).new == 1
    assert _pairs(store.iter_traces()) == {(Q1, A1), (Q2, A2)}


def test_history_cut_at_max_history(tmp_path: Path) -> None:
    """At the cap the oldest messages are gone: [Q1, S, A2] may be the tail of an auto-resumed run."""
    cut = samples.turn(Q1, A2, RUN) + samples.turn("next", "done", "cccc0001")
    samples.write_checkpoint(_cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": cut}, max_history=len(cut)))
    loader = CheckpointLoader(tmp_path)
    assert _pairs(loader.load()) == {("next", "done")}
    assert any("max_history" in r for r in loader.summary.skip_reasons)
    samples.write_obs_run(_obs_dir(tmp_path), samples.obs_run(RUN, AGENT, "s", Q1, A1, followups=[(Q2, A2, [])]))
    assert _pairs(CheckpointLoader(tmp_path).load()) == {(Q1, A1), (Q2, A2), ("next", "done")}


def test_a_history_that_starts_mid_turn(tmp_path: Path) -> None:
    history = samples.turn(Q1, A1, "dddd0001")[1:] + samples.turn(Q2, A2, "dddd0002")
    samples.write_checkpoint(_cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": history}))
    assert _pairs(CheckpointLoader(tmp_path).load()) == {(Q2, A2)}


def test_v1_checkpoint_dispatched_on_its_class(tmp_path: Path) -> None:
    history = [
        {"role": "user", "content": "hello", "timestamp": "2025-12-01T10:00:00"},
        {"role": "assistant", "content": "hi there", "timestamp": "2025-12-01T10:00:02"},
        {"role": "user", "content": "bye", "timestamp": "2025-12-01T10:01:00"},
        {"role": "assistant", "content": "see you", "timestamp": "2025-12-01T10:01:01"},
    ]
    samples.write_checkpoint(
        tmp_path / "Agents" / "checkpoint" / "old_agent",
        samples.v1_checkpoint("old_agent", {"main": history}),
        stamp="20251201_100200",
    )
    traces = CheckpointLoader(tmp_path).load()
    assert _pairs(traces) == {("hello", "hi there"), ("bye", "see you")}
    t = next(t for t in traces if t.user_query == "hello")
    assert (t.agent_name, t.session_id, t.timestamp, t.run_id) == ("old_agent", "main", "2025-12-01T10:00:00", None)
    assert t.metadata["flowagent"]["checkpoint_kind"] == "v1"
    assert t.total_tokens_in is None  # agent_state holds lifetime totals


def test_sessions_repeated_across_many_snapshots(tmp_path: Path) -> None:
    history: list[dict] = []
    for n in range(6):
        history = history + samples.turn(f"q{n}", f"a{n}", f"eeee000{n}")
        samples.write_checkpoint(
            _cp_dir(tmp_path),
            samples.v2_checkpoint(AGENT, {"s": history, "other": samples.turn("same", "same", "ffff0001")}),
            stamp=f"20261122_10000{n}",
        )
    loader = CheckpointLoader(tmp_path)
    traces = loader.load()
    assert len(traces) == 7
    s = loader.summary
    assert (s.read, s.new, s.duplicate) == (sum(range(1, 7)) + 6, 7, sum(range(1, 7)) + 6 - 7)


def test_cut_history_whose_oldest_turn_was_seen_before(tmp_path: Path) -> None:
    """Once a history is at its cap, its oldest turn was usually read from an earlier snapshot: a duplicate."""
    first = samples.turn(Q1, A1, "abab0001") + samples.turn("next", "done", "abab0002")
    samples.write_checkpoint(_cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": first}), stamp="20261122_100000")
    cut = samples.turn("next", "done", "abab0002") + samples.turn("third", "3", "abab0003")
    samples.write_checkpoint(
        _cp_dir(tmp_path), samples.v2_checkpoint(AGENT, {"s": cut}, max_history=len(cut)), stamp="20261122_100100"
    )
    loader = CheckpointLoader(tmp_path)
    assert _pairs(loader.load()) == {(Q1, A1), ("next", "done"), ("third", "3")}
    assert loader.summary.skipped == 0 and loader.summary.duplicate == 1
