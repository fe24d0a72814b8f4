"""Offline GRPO: logged groups replayed through TRL's rollout_func, in order, whole, with tool results masked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

from helpers_tiny_model import tiny_tokenizer  # noqa: E402

from flowrl.data.tokens import ChatRenderer  # noqa: E402
from flowrl.errors import ConfigError  # noqa: E402
from flowrl.train.offline_grpo import OfflineGroups  # noqa: E402


def _a(text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


def _row(q: str, rewards: list[float], completions: list[Any] | None = None) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": q}],
        "completions": completions or [_a(f"{q} answer {i}") for i in range(len(rewards))],
        "rewards": rewards,
    }


def _trainer(tokenizer: Any, process_index: int = 0) -> Any:
    return SimpleNamespace(
        processing_class=tokenizer, chat_template_kwargs={}, accelerator=SimpleNamespace(process_index=process_index)
    )


@pytest.fixture(scope="module")
def tok() -> Any:
    return tiny_tokenizer()


def _groups(rows: list[dict[str, Any]], g: int, tok: Any) -> OfflineGroups:
    groups = OfflineGroups(rows, g)
    groups.encode(ChatRenderer(tok))
    return groups


TOOL_TRAJECTORY = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "exec_code", "arguments": {"code": "print(12 * 7)"}}}],
    },
    {"role": "tool", "content": "84", "name": "exec_code"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "final_answer", "arguments": {"answer": "84"}}}],
    },
]


def test_rollout_replays_each_group_in_logged_order(tok: Any) -> None:
    groups = _groups([_row("q1", [0.1, 0.9]), _row("q2", [1.0, 0.0])], 2, tok)
    p1, p2 = groups.prompts()
    out = groups.rollout_func([p1, p1, p2, p2], _trainer(tok))
    assert out["logged_reward"] == [0.1, 0.9, 1.0, 0.0]
    assert out["logprobs"] is None
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in out["completion_ids"]]
    assert texts == ["q1 answer 0", "q1 answer 1", "q2 answer 0", "q2 answer 1"]
    assert all(ids[-1] == tok.eos_token_id for ids in out["completion_ids"])
    assert OfflineGroups.logged_reward(prompts=[p1] * 4, completions=[None] * 4, **out) == [0.1, 0.9, 1.0, 0.0]


def test_a_group_split_across_processes_keeps_its_order(tok: Any) -> None:
    groups = _groups([_row("q", [0.0, 0.2, 0.4, 0.6])], 4, tok)
    (p,) = groups.prompts()
    first = groups.rollout_func([p, p], _trainer(tok, process_index=0))
    second = groups.rollout_func([p, p], _trainer(tok, process_index=1))
    assert first["logged_reward"] + second["logged_reward"] == [0.0, 0.2, 0.4, 0.6]


def test_tool_results_are_in_the_sequence_but_masked(tok: Any) -> None:
    completion = [*TOOL_TRAJECTORY[:2], {"role": "assistant", "content": "It is 84."}]
    prompt = [{"role": "user", "content": "what?"}]
    groups = _groups([{"prompt": prompt, "completions": [completion, _a("no")], "rewards": [1.0, 0.0]}], 2, tok)
    enc = next(iter(groups.groups.values())).encoded[0]
    p_ids, c_ids, mask = enc.prompt_ids, enc.completion_ids, enc.env_mask
    assert len(c_ids) == len(mask) and 0 in mask and mask[0] == 1 and mask[-1] == 1
    full = tok.apply_chat_template(prompt + completion, tokenize=False)
    assert tok.decode(p_ids + c_ids) == full.rstrip("\n")
    masked = tok.decode([t for t, m in zip(c_ids, mask) if m == 0])
    assert "84" in masked and "It is 84." not in masked and "<|im_start|>assistant" in masked


def _qwen3_tokenizer() -> Any:
    """The tiny tokenizer with Qwen3's chat template as TRL ships it (not prefix-preserving: it drops the
    empty think block of earlier turns)."""
    from trl.chat_template_utils import _CHAT_TEMPLATES_DIR

    qwen = tiny_tokenizer(["<think>", "</think>", "<tool_call>", "<tool_response>"])
    qwen.chat_template = (_CHAT_TEMPLATES_DIR / "qwen3.jinja").read_text(encoding="utf-8")
    return qwen


def test_regression_non_prefix_preserving_template_keeps_the_whole_trajectory() -> None:
    """Main swapped a tool-calling trajectory for `'\\n<|im_end|>'` (2 tokens, all trained) when the template was
    not prefix-preserving. Now Qwen3's training template renders it: tool call, tool result, final answer."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    qwen = _qwen3_tokenizer()
    assert not is_chat_template_prefix_preserving(qwen)
    prompt = [{"role": "user", "content": "What is 12 * 7?"}]
    groups = _groups([{"prompt": prompt, "completions": [TOOL_TRAJECTORY, _a("83")], "rewards": [1.0, 0.0]}], 2, qwen)
    enc = next(iter(groups.groups.values())).encoded[0]
    text = qwen.decode(enc.completion_ids)
    assert "exec_code" in text and "84" in text and "final_answer" in text and len(enc.completion_ids) > 20
    trained = qwen.decode([t for t, m in zip(enc.completion_ids, enc.env_mask) if m])
    assert "exec_code" in trained and "final_answer" in trained and "<tool_response>" not in trained
    assert trained.count("<|im_end|>") == 2  # both turns learn to stop
    assert groups.encode_stats.render.counts["template: TRL training template"] == 1


def test_regression_completion_length_comes_from_the_data(tok: Any, tmp_path: Path) -> None:
    """Main cut logged trajectories at the profile's 96 tokens (clipped_ratio 1.0, `final_answer` cut at
    `{"answer`). Now the run takes the longest trajectory's length, and a smaller explicit value stops it."""
    from flowrl.train.config import TrainingConfig
    from flowrl.train.hardware import HardwareInfo, resolve_settings
    from flowrl.train.trainers import _completion_length

    long_answer = " ".join(["word"] * 150)
    rows = [
        {
            "prompt": [{"role": "user", "content": "q"}],
            "completions": [_a(long_answer), _a("no")],
            "rewards": [1.0, 0.0],
        }
    ]
    groups = _groups(rows, 2, tok)
    needed = groups.longest_completion
    assert needed > 96
    cfg = TrainingConfig(method="grpo-offline", dataset=tmp_path, output_dir=tmp_path / "o")
    settings = resolve_settings(cfg, HardwareInfo(accelerator="cpu"))
    assert settings.max_completion_length == 96
    assert _completion_length(cfg, settings, needed).max_completion_length == needed
    with pytest.raises(ConfigError, match=f"--max-completion-length {needed}"):
        _completion_length(cfg.model_copy(update={"max_completion_length": 64}), settings, needed)


def test_logged_logprobs_reach_trl_only_when_every_completion_has_them(tok: Any) -> None:
    prompt = [{"role": "user", "content": "q"}]
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    fp = ChatRenderer(tok).fingerprint
    answer = tok.encode("The answer", add_special_tokens=False) + [tok.eos_token_id]
    call = {"prompt_ids": ids, "completion_ids": answer, "logprobs": [-0.5] * len(answer), "tokenizer": fp}
    rows = [
        {
            "prompt": prompt,
            "completions": [_a("The answer"), _a("x")],
            "rewards": [1.0, 0.0],
            "logged_tokens": [[call], [{**call, "logprobs": None}]],
        }
    ]
    groups = _groups(rows, 2, tok)
    (p,) = groups.prompts()
    out = groups.rollout_func([p, p], _trainer(tok))
    assert out["completion_ids"][0] == answer and out["prompt_ids"][0] == ids
    assert out["logprobs"] is None and not groups.with_logprobs  # one completion lacks them: on-policy, said once
    rows[0]["logged_tokens"][1] = [call]
    groups = _groups(rows, 2, tok)
    out = groups.rollout_func([p, p], _trainer(tok))
    assert out["logprobs"] == [[-0.5] * len(answer)] * 2 and groups.with_logprobs


def test_groups_are_trimmed_filtered_and_counted() -> None:
    rows = [
        _row("big", [0.0, 0.1, 0.5, 0.9, 1.0, 0.3]),  # trimmed to 4 spanning the range
        _row("flat", [0.5, 0.5, 0.5, 0.5]),  # no signal
        _row("small", [0.0, 1.0]),  # fewer than 4
        _row("big", [0.0, 0.1, 0.5, 0.9]),  # same prompt again
    ]
    groups = OfflineGroups(rows, 4)
    s = groups.stats
    assert (s.used, s.trimmed, s.zero_variance, s.too_small, s.duplicate_prompt) == (1, 1, 1, 1, 1)
    (group,) = groups.groups.values()
    assert len(group.rewards) == 4 and min(group.rewards) == 0.0 and max(group.rewards) == 1.0


def test_nothing_usable_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no usable group"):
        OfflineGroups([_row("flat", [0.5, 0.5])], 2)
    with pytest.raises(ConfigError, match="logged rewards"):
        OfflineGroups([{"prompt": "p", "completions": ["a", "b"]}], 2)


def _offline_pipeline(tmp_path: Path, **settings: Any) -> Any:
    """Training on an offline GRPO set from flowrl's own builder (synthetic tool-calling traces), tiny model, CPU."""
    from helpers_tiny_train import build_tiny_model

    from flowrl.data import DatasetPipeline, GRPODatasetBuilder
    from flowrl.data.synthetic import synthetic_trace
    from flowrl.train import TrainingConfig, TrainingPipeline
    from flowrl.train.hardware import HardwareInfo

    traces = [synthetic_trace(i, n_tasks=4) for i in range(16)]
    DatasetPipeline(GRPODatasetBuilder(offline=True), val_fraction=0.0).build(traces, tmp_path / "ds")
    model = build_tiny_model(tmp_path / "tiny")
    cfg = TrainingConfig(
        method="grpo-offline",
        dataset=tmp_path / "ds",
        base_model=str(model),
        output_dir=tmp_path / "out",
        max_steps=2,
        progress_bar=False,
        **settings,
    )
    return TrainingPipeline(cfg, hardware=HardwareInfo(accelerator="cpu"))


def test_the_flowrl_grpo_offline_dataset_trains(tmp_path: Path) -> None:
    """A dataset from flowrl's own builder (synthetic tool-calling traces) replays through TRL."""
    result = _offline_pipeline(tmp_path).run()
    assert result.global_step == 2
    assert result.info["offline_groups"]["used"] >= 1
    assert result.last_metrics["reward_std"] > 0


def test_too_few_groups_for_the_generation_batch_is_refused_before_training(tmp_path: Path) -> None:
    """The GPU profile's batch 8 x accumulation 4 with groups of 4 needs 8 groups per generation batch: with
    fewer, TRL's sampler yields no batch and no step runs (seen on an H100 with the 3 groups of the example
    agent's captured runs). flowrl says so before TRL loads the model, with the numbers and the fix."""
    pipeline = _offline_pipeline(tmp_path, per_device_train_batch_size=8, gradient_accumulation_steps=4)
    with pytest.raises(ConfigError, match=r"groups, but one generation batch of 32 completions .* lower --grad-accum"):
        pipeline.run()
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # refused before any training


@pytest.mark.parametrize(
    ("rows", "batch", "world", "accumulation", "generations", "refused"),
    [
        (3, 8, 1, 4, 4, True),  # 32 completions = 8 groups of 4 > 3
        (3, 8, 1, 1, 4, False),  # 8 completions = 2 groups: fits (what ran on the H100)
        (8, 8, 1, 4, 4, False),
        (7, 8, 1, 4, 8, False),  # online GRPO: 32 completions = 4 prompts of 8
        (3, 8, 1, 4, 8, True),
        (3, 4, 2, 2, 4, True),  # 2 processes: 16 completions = 4 groups
    ],
)
def test_generation_batch_check(
    rows: int, batch: int, world: int, accumulation: int, generations: int, refused: bool
) -> None:
    from flowrl.train.trainers import check_grpo_batch_fits

    args = SimpleNamespace(generation_batch_size=batch * world * accumulation, num_generations=generations)
    settings = SimpleNamespace(per_device_train_batch_size=batch, world_size=world)
    train = list(range(rows))
    if refused:
        with pytest.raises(ConfigError, match=f"takes {batch * world * accumulation // generations} "):
            check_grpo_batch_fits(args, train, settings, offline=True, source="ds")  # type: ignore[arg-type]
    else:
        check_grpo_batch_fits(args, train, settings, offline=True, source="ds")  # type: ignore[arg-type]
