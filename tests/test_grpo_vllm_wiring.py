"""`--use-vllm`: what reaches TRL's GRPOConfig, the refusals before anything loads, and the agent's turns on a
colocated vLLM engine (a fake with vLLM's request/output shape: no GPU here, and vllm is not installed).
On a GPU these paths have not run yet (README, "What has run where")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers_tiny_model import tiny_model_and_tokenizer

from flowrl.errors import ConfigError, FlowRLError
from flowrl.train.agent_rollout import PolicyBackend, colocated_vllm
from flowrl.train.config import TrainingConfig
from flowrl.train.hardware import HardwareInfo, resolve_settings
from flowrl.train.trainers import check_vllm, trl_config_kwargs

GPU = HardwareInfo(
    accelerator="cuda", gpu_count=1, gpu_names=("H100",), gpu_memory_gb=(80.0,), bf16=True, fp16=True, bitsandbytes=True
)
CPU = HardwareInfo(accelerator="cpu", cpu_count=2)


def test_use_vllm_reaches_grpo_config_with_the_mode_and_memory_share(tmp_path: Path) -> None:
    from trl import GRPOConfig

    cfg = TrainingConfig(method="grpo", dataset=Path("d"), use_vllm=True, vllm_gpu_memory_utilization=0.4)
    kwargs = trl_config_kwargs(cfg, resolve_settings(cfg, GPU), tmp_path)
    assert (kwargs["use_vllm"], kwargs["vllm_mode"], kwargs["vllm_gpu_memory_utilization"]) == (True, "colocate", 0.4)
    args = GRPOConfig(**{**kwargs, "bf16": False, "use_cpu": True})  # TRL takes every name flowrl sets
    assert args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == 0.4
    assert args.vllm_importance_sampling_correction  # TRL's default: sampled logprobs correct the ratio
    off = trl_config_kwargs(TrainingConfig(method="grpo", dataset=Path("d")), resolve_settings(cfg, GPU), tmp_path)
    assert off["use_vllm"] is False and "vllm_mode" not in off


def test_use_vllm_is_refused_where_it_cannot_run() -> None:
    cfg = TrainingConfig(method="grpo", dataset=Path("d"), use_vllm=True)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        check_vllm(cfg, resolve_settings(cfg, CPU))
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="pip install vllm"):
            check_vllm(cfg, resolve_settings(cfg, GPU))
    with pytest.raises(ConfigError, match="colocated vLLM only"):
        TrainingConfig.from_dict({"method": "grpo", "agent": "x", "use_vllm": True, "vllm_mode": "server"})
    with pytest.raises(ConfigError, match="does not generate"):
        TrainingConfig.from_dict({"method": "kto", "dataset": "d", "use_vllm": True})


class _Step(dict):
    """vLLM's per-token logprob dict: token id -> Logprob(logprob, rank)."""


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, reply: list[int]) -> tuple[Any, list[Any]]:
    calls: list[Any] = []
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw)))

    class LLM:
        def generate(self, prompts: list[dict], sampling_params: Any, use_tqdm: bool) -> list[Any]:
            calls.append((prompts, sampling_params))
            steps = [_Step({t: SimpleNamespace(logprob=-0.5 - i, rank=1)}) for i, t in enumerate(reply)]
            return [
                SimpleNamespace(
                    prompt_token_ids=prompts[0]["prompt_token_ids"],
                    outputs=[SimpleNamespace(token_ids=tuple(reply), logprobs=steps)],
                )
            ]

    return LLM(), calls


def test_agent_turns_generate_on_the_colocated_engine_with_ids_in_and_logprobs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, tokenizer = tiny_model_and_tokenizer()
    eos = tokenizer.eos_token_id
    llm, calls = _fake_vllm(monkeypatch, [7, 8, eos])
    trainer = SimpleNamespace(
        model_wrapped=None,
        accelerator=None,
        generation_kwargs={},
        processing_class=tokenizer,
        temperature=0.7,
        generation_config=None,
        eos_token_ids=[eos],
        use_vllm=True,
        vllm_generation=SimpleNamespace(mode="colocate", llm=llm),
        args=SimpleNamespace(vllm_tensor_parallel_size=1, vllm_enable_sleep_mode=False),
    )
    backend = PolicyBackend.from_trainer(trainer, max_new_tokens=16).episode(episode_tokens=None, max_turns=3)
    reply = backend.complete([{"role": "user", "content": "hi"}])
    ((prompts, params),) = calls
    assert prompts[0]["prompt_token_ids"] == reply.prompt_token_ids
    assert (params.temperature, params.max_tokens, params.logprobs, params.n) == (0.7, 16, 0, 1)
    assert eos in params.stop_token_ids
    assert reply.token_ids == [7, 8, eos] and reply.logprobs == [-0.5, -1.5, -2.5]
    assert backend.ended(backend.calls[0].completion_ids)


def test_colocated_engine_refuses_what_a_per_turn_generate_cannot_do() -> None:
    def trainer(mode: str = "colocate", tp: int = 1, sleep: bool = False) -> Any:
        return SimpleNamespace(
            vllm_generation=SimpleNamespace(mode=mode, llm="engine"),
            args=SimpleNamespace(vllm_tensor_parallel_size=tp, vllm_enable_sleep_mode=sleep),
        )

    assert colocated_vllm(trainer()) == "engine"
    with pytest.raises(FlowRLError, match="colocate"):
        colocated_vllm(trainer(mode="server"))
    with pytest.raises(FlowRLError, match="tensor_parallel_size 1"):
        colocated_vllm(trainer(tp=2))
    with pytest.raises(FlowRLError, match="sleep_mode"):
        colocated_vllm(trainer(sleep=True))
