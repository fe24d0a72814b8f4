"""`flowrl eval` judges answers only against host, dataset or task references (issue 22).

A reference a dataset builder guessed from another run's answer (GRPO `reference_source = "best_trace"`, a DPO
`chosen`, a KTO completion) is never one: the prompt gets no reference, `reference_answer` says it cannot
judge (None) and the combined score leaves it out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("datasets")

from flowrl.data import DatasetPipeline, DPODatasetBuilder, GRPODatasetBuilder, KTODatasetBuilder  # noqa: E402
from flowrl.evaluate.prompts import answer_trace, load_prompts  # noqa: E402
from flowrl.rewards.engine import RewardEngine  # noqa: E402
from flowrl.trace.schema import ExecutionTrace  # noqa: E402

SUM, CAPITAL = "What is 2 + 2?", "Capital of France?"
ANSWERS = {SUM: "2 + 2 = 4", CAPITAL: "It is Paris."}


def _run(n: int, query: str, answer: str, reward: float, metadata: dict[str, str] | None = None) -> ExecutionTrace:
    return ExecutionTrace(
        trace_id=f"t{n}",
        user_query=query,
        reward_score=reward,
        label=reward > 0.5,
        label_source="engine",
        metadata=metadata or {},
        messages=[{"role": "user", "content": query}, {"role": "assistant", "content": answer}],
    )


# "What is 2 + 2?" has no known answer: the good run's "The answer is 4." is all a builder could guess from.
# "Capital of France?" carries the host's reference.
RUNS = [
    _run(1, SUM, "The answer is 4.", 0.9),
    _run(2, SUM, "5", 0.1),
    _run(3, CAPITAL, "Paris", 0.9, {"reference_answer": "Paris"}),
    _run(4, CAPITAL, "Rome", 0.1, {"reference_answer": "Paris"}),
]


def _scores(prompts: list) -> dict[str, tuple[str | None, float | None, float | None]]:
    """Per prompt: (its reference, the reference_answer reward, the combined score) of the right answer."""
    engine = RewardEngine()
    results = engine.compute_batch([answer_trace(p, ANSWERS[p.query]) for p in prompts])
    return {
        p.query: (p.reference, r["reference_answer"].value, engine.compute_combined(r))
        for p, r in zip(prompts, results)
    }


@pytest.mark.parametrize(
    "builder", [GRPODatasetBuilder(), KTODatasetBuilder(), DPODatasetBuilder()], ids=["grpo", "kto", "dpo"]
)
def test_eval_never_takes_a_guessed_reference_from_a_built_dataset(  # type: ignore[no-untyped-def]
    builder,
    tmp_path: Path,
) -> None:
    out = tmp_path / "data"
    DatasetPipeline(builder, val_fraction=0.0).build(RUNS, out)
    prompts, _ = load_prompts(out)
    scores = _scores(prompts)
    reference, value, combined = scores[SUM]
    assert reference is None and value is None  # cannot judge, never 0 against "The answer is 4."
    assert combined is not None and combined > 0.5  # left out of the combined score, not counted as a miss
    if isinstance(builder, GRPODatasetBuilder):  # the only builder that writes the task's own reference
        assert scores[CAPITAL][:2] == ("Paris", 1.0)
    else:  # DPO chosen and KTO completions are answers of runs, not references
        assert scores[CAPITAL][:2] == (None, None)


def test_a_real_reference_in_a_later_row_of_the_same_prompt_is_kept(tmp_path: Path) -> None:
    rows = [
        {"prompt": SUM, "reference_answer": "The answer is 4.", "reference_source": "best_trace"},
        {"prompt": SUM, "reference_answer": "4", "reference_source": "dataset"},
        {"prompt": CAPITAL, "reference_answer": "Paris", "reference_source": "metadata"},
        {"prompt": CAPITAL, "reference_answer": "Rome", "reference_source": "best_trace"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts, _ = load_prompts(path)
    assert [p.query for p in prompts] == [SUM, CAPITAL]  # still one prompt each
    scores = _scores(prompts)
    assert scores[SUM][:2] == ("4", 1.0) and scores[CAPITAL][:2] == ("Paris", 1.0)
    assert all("reference_source" not in p.metadata for p in prompts)
