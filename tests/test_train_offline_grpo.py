"""Offline GRPO: logged groups replayed through TRL's rollout_func, in order, with tool results masked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

from helpers_tiny_model import tiny_tokenizer  # noqa: E402

from flowrl.errors import ConfigError  # noqa: E402
from flowrl.train.offline_grpo import OfflineGroups, encode_pair  # noqa: E402


def _a(text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


def _row(q: str, rewards: list[float], completions: list[Any] | None = None) -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": q}],
            "completions": completions or [_a(f"{q} answer {i}") for i in range(len(rewards))],
            "rewards": rewards}


def _trainer(tokenizer: Any, process_index: int = 0) -> Any:
    return SimpleNamespace(processing_class=tokenizer, chat_template_kwargs={},
                           accelerator=SimpleNamespace(process_index=process_index))


@pytest.fixture(scope="module")
def tok() -> Any:
    return tiny_tokenizer()


def test_rollout_replays_each_group_in_logged_order(tok: Any) -> None:
    groups = OfflineGroups([_row("q1", [0.1, 0.9]), _row("q2", [1.0, 0.0])], 2, max_completion_length=64)
    p1, p2 = groups.prompts()
    out = groups.rollout_func([p1, p1, p2, p2], _trainer(tok))
    assert out["logged_reward"] == [0.1, 0.9, 1.0, 0.0]
    assert out["logprobs"] is None
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in out["completion_ids"]]
    assert texts == ["q1 answer 0", "q1 answer 1", "q2 answer 0", "q2 answer 1"]
    assert all(ids[-1] == tok.eos_token_id for ids in out["completion_ids"])
    assert OfflineGroups.logged_reward(prompts=[p1] * 4, completions=[None] * 4, **out) == [0.1, 0.9, 1.0, 0.0]


def test_a_group_split_across_processes_keeps_its_order(tok: Any) -> None:
    groups = OfflineGroups([_row("q", [0.0, 0.2, 0.4, 0.6])], 4, max_completion_length=64)
    (p,) = groups.prompts()
    first = groups.rollout_func([p, p], _trainer(tok, process_index=0))
    second = groups.rollout_func([p, p], _trainer(tok, process_index=1))
    assert first["logged_reward"] + second["logged_reward"] == [0.0, 0.2, 0.4, 0.6]


def test_tool_results_are_in_the_sequence_but_masked(tok: Any) -> None:
    completion = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "exec_code", "arguments": {"code": "print(2)"}}}]},
        {"role": "tool", "content": "2", "name": "exec_code"},
        {"role": "assistant", "content": "It is 2."},
    ]
    prompt = [{"role": "user", "content": "what?"}]
    p_ids, c_ids, mask = encode_pair(tok, prompt, completion, max_completion_length=256)
    assert len(c_ids) == len(mask) and 0 in mask and mask[0] == 1 and mask[-1] == 1
    full = tok.apply_chat_template(prompt + completion, tokenize=False)
    assert tok.decode(p_ids + c_ids) == full.rstrip("\n")
    masked = tok.decode([t for t, m in zip(c_ids, mask) if m == 0])
    assert "2" in masked and "It is 2." not in masked
    _, short, short_mask = encode_pair(tok, prompt, completion, max_completion_length=5)
    assert len(short) == len(short_mask) == 5


def test_groups_are_trimmed_filtered_and_counted() -> None:
    rows = [
        _row("big", [0.0, 0.1, 0.5, 0.9, 1.0, 0.3]),  # trimmed to 4 spanning the range
        _row("flat", [0.5, 0.5, 0.5, 0.5]),  # no signal
        _row("small", [0.0, 1.0]),  # fewer than 4
        _row("big", [0.0, 0.1, 0.5, 0.9]),  # same prompt again
    ]
    groups = OfflineGroups(rows, 4, max_completion_length=8)
    s = groups.stats
    assert (s.used, s.trimmed, s.zero_variance, s.too_small, s.duplicate_prompt) == (1, 1, 1, 1, 1)
    (group,) = groups.groups.values()
    assert len(group.rewards) == 4 and min(group.rewards) == 0.0 and max(group.rewards) == 1.0


def test_nothing_usable_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no usable group"):
        OfflineGroups([_row("flat", [0.5, 0.5])], 2, max_completion_length=8)
    with pytest.raises(ConfigError, match="logged rewards"):
        OfflineGroups([{"prompt": "p", "completions": ["a", "b"]}], 2, max_completion_length=8)


def test_the_flowrl_grpo_offline_dataset_trains(tmp_path: Path) -> None:
    """A dataset from flowrl's own builder (synthetic tool-calling traces) replays through TRL."""
    from helpers_tiny_train import build_tiny_model

    from flowrl.data import DatasetPipeline, GRPODatasetBuilder
    from flowrl.data.synthetic import synthetic_trace
    from flowrl.train import TrainingConfig, TrainingPipeline
    from flowrl.train.hardware import HardwareInfo

    traces = [synthetic_trace(i, n_tasks=4) for i in range(16)]
    DatasetPipeline(GRPODatasetBuilder(offline=True), val_fraction=0.0).build(traces, tmp_path / "ds")
    model = build_tiny_model(tmp_path / "tiny")
    cfg = TrainingConfig(method="grpo-offline", dataset=tmp_path / "ds", base_model=str(model),
                         output_dir=tmp_path / "out", max_steps=2, max_completion_length=64, progress_bar=False)
    result = TrainingPipeline(cfg, hardware=HardwareInfo(accelerator="cpu")).run()
    assert result.global_step == 2
    assert result.info["offline_groups"]["used"] >= 1
    assert result.last_metrics["reward_std"] > 0
