"""flowrl eval: held-out prompts, greedy answers from model and baseline, flowrl rewards, JSON + PNG report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers_tiny_train import build_tiny_model, write_tiny_dataset  # noqa: E402

from flowrl.errors import ConfigError  # noqa: E402
from flowrl.evaluate.prompts import answer_trace, default_baseline, evaluate, load_prompts  # noqa: E402
from flowrl.train.hardware import HardwareInfo  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(tiny base model, SFT adapter output folder, its dataset)."""
    from flowrl.train import TrainingConfig, TrainingPipeline

    root = tmp_path_factory.mktemp("eval")
    base = build_tiny_model(root / "base")
    data = write_tiny_dataset(root / "sft-data", "sft")
    cfg = TrainingConfig(
        method="sft",
        dataset=data,
        base_model=str(base),
        output_dir=root / "out",
        max_steps=2,
        learning_rate=1e-2,
        progress_bar=False,
    )
    TrainingPipeline(cfg, hardware=HardwareInfo(accelerator="cpu")).run()
    return base, root / "out", data


def test_prompts_come_from_the_validation_split_in_any_trl_format(tmp_path: Path) -> None:
    for method in ("sft", "dpo", "kto", "grpo"):
        data = write_tiny_dataset(tmp_path / method, method)
        prompts, split = load_prompts(data)
        assert split == "validation"
        assert prompts and all(p.messages[-1]["role"] == "user" for p in prompts)
        # a reference only where the row has one (GRPO's `reference` column); an answer a logged run gave
        # (DPO chosen, a desirable KTO completion, an SFT reply) is a guess, never a reference (flowrl.trace.facts)
        assert [p.reference is not None for p in prompts] == [method == "grpo"] * len(prompts)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "Say hi.", "reference_answer": "hi", "task": "greet"}\n{"prompt": "Say hi."}\n')
    prompts, split = load_prompts(jsonl)
    assert split is None and len(prompts) == 1  # deduplicated
    assert prompts[0].messages == [{"role": "user", "content": "Say hi."}]
    assert prompts[0].reference == "hi" and prompts[0].metadata["task"] == "greet"
    guessed = tmp_path / "g.jsonl"
    guessed.write_text('{"prompt": "Sum?", "reference_answer": "55", "reference_source": "best_trace"}\n')
    (prompt,), _ = load_prompts(guessed)
    assert prompt.reference is None and "reference_answer" not in answer_trace(prompt, "55").metadata


def test_answer_trace_carries_query_answer_and_reference(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(
        '{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}], '
        '"reference_answer": "4"}\n'
    )
    (prompt,), _ = load_prompts(jsonl)
    trace = answer_trace(prompt, "4")
    assert trace.user_query == "2+2?" and trace.final_response == "4"
    assert trace.messages[-1] == {"role": "assistant", "content": "4"}
    assert trace.metadata["reference_answer"] == "4"


def test_eval_compares_the_adapter_with_its_base_and_writes_the_report(trained: tuple[Path, Path, Path]) -> None:
    base, out, data = trained
    assert default_baseline(str(out)) == str(base)
    report = evaluate(str(out), data, out_dir=out, max_new_tokens=8, rewards=["format", "efficiency"])
    assert report.model == str(out) and report.baseline == str(base) and report.n_prompts == 2
    saved = json.loads((out / "eval_report.json").read_text())
    assert set(saved) >= {"model", "baseline", "n_prompts", "per_reward", "combined", "samples"}
    assert set(saved["per_reward"]) == {"format", "efficiency"}
    assert set(saved["per_reward"]["efficiency"]) >= {"baseline", "model"}
    assert set(saved["combined"]) == {"baseline", "model"}
    sample = saved["samples"][0]
    assert {"prompt", "reference", "model", "baseline"} <= set(sample)
    assert set(sample["model"]) == {"answer", "rewards", "combined"}
    png = out / "eval_report.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_cli_prints_base_and_trained_side_by_side(
    trained: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowrl.cli import main

    _, out, data = trained
    code = main(
        [
            "eval",
            "--model",
            str(out),
            "--prompts",
            str(data),
            "--out",
            str(tmp_path),
            "--max-new-tokens",
            "4",
            "--rewards",
            "efficiency",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "baseline" in text and "model" in text and "efficiency" in text and "combined" in text
    assert (tmp_path / "eval_report.json").is_file()


def test_no_baseline_and_unknown_reward(trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, _, data = trained
    report = evaluate(str(base), data, baseline="", max_new_tokens=2, rewards=["efficiency"])
    assert report.baseline is None and report.combined["baseline"] is None
    with pytest.raises(ConfigError, match="unknown reward"):
        evaluate(str(base), data, baseline="", rewards=["nope"])
