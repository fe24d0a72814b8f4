"""Prototype for flowrl issue 14: online GRPO that runs the agent (TRL 1.16.0, CPU, tiny random model).

Three 1-step GRPO runs on the ~30k-parameter Llama from /work/main/tests/helpers_tiny_model.py:

  A. rollout_func + a scripted 2-turn episode: model turn -> tool result (mask 0) -> model turn, generated with
     the trainer's own policy (plain transformers `generate`, no vLLM), logprobs recorded, the LLM calls merged into
     one sequence with flowrl's `merge_calls` (Agent Lightning merge), extra per-rollout fields forwarded to a
     reward function that reads them.
  B. TRL's own `environment_factory` loop (tools = env methods, tool output masked by TRL, env `get_reward`).
     A random model never writes a tool call, so the first turn is forced to a scripted tool call by wrapping
     `trainer._generate_single_turn` once (wiring test only).
  C. rollout_func that runs flowrl's real example agent (flowrl.demo.agent.ExampleAgent: ReAct loop, tools executed)
     on a TokensInBackend subclass that generates with the trainer's policy; the first reply is scripted to a
     `lookup` tool call so the loop takes two turns.

Run:  nice -n 19 /work/main/.venv/bin/python -B /tmp/issue14/proto.py [A|B|C ...]
Writes only under /tmp/issue14/.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # never write __pycache__ into /work/main
sys.path.insert(0, "/work/main/tests")
sys.path.insert(0, "/work/main")

import asyncio  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from helpers_tiny_model import save_tiny_model  # noqa: E402

ROOT = Path("/tmp/issue14")
MODEL_DIR = ROOT / "tiny"
TURN_TOKENS = 8  # new tokens per model turn (tiny budget)
FORCED_CALL = '<tool_call>{"name": "lookup", "arguments": {"key": "capital of france"}}</tool_call>'
REPORT: dict[str, Any] = {}


# --------------------------------------------------------------------------------------------- common helpers

def tiny_model_dir() -> Path:
    if not (MODEL_DIR / "config.json").exists():
        save_tiny_model(MODEL_DIR)
    return MODEL_DIR


def dataset():
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": [{"role": "user", "content": "What is the capital of France?"}], "answer": "Paris"},
        {"prompt": [{"role": "user", "content": "What is 12 times 7 plus 3?"}], "answer": "87"},
    ])


def grpo_args(out: str, **extra: Any):
    from trl import GRPOConfig

    kw = dict(
        output_dir=str(ROOT / "runs" / out), max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=64, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, dataloader_pin_memory=False, disable_tqdm=True, beta=0.04, mask_truncated_completions=True,
        use_vllm=False, seed=0,
    )
    kw.update(extra)
    return GRPOConfig(**kw)


def spy_on(trainer) -> dict[str, Any]:
    """Keep what `_generate_and_score_completions` hands the loss (masks, advantages)."""
    seen: dict[str, Any] = {}
    original = trainer._generate_and_score_completions

    def wrapped(inputs):
        out = original(inputs)
        seen["batch"] = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        if "sampling_per_token_logps" in out:
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
            att = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, att, out["completion_ids"].size(1), batch_size=ids.size(0))
            mask = out["completion_mask"] * out.get("tool_mask", torch.ones_like(out["completion_mask"]))
            diff = (logps - out["sampling_per_token_logps"]).abs() * mask
            seen["logp_diff"] = float(diff.max())
        return out

    trainer._generate_and_score_completions = wrapped
    return seen


def summarize(name: str, trainer, seen: dict[str, Any], extra: dict[str, Any]) -> None:
    b = seen.get("batch", {})
    cm, tm = b.get("completion_mask"), b.get("tool_mask")
    rec: dict[str, Any] = {
        "global_step": trainer.state.global_step,
        "log": [h for h in trainer.state.log_history],
        "completion_ids_shape": list(b["completion_ids"].shape) if "completion_ids" in b else None,
        "completion_mask_row_sums": cm.sum(1).tolist() if cm is not None else None,
        "tool_mask_present": tm is not None,
        "tool_mask_zeros_per_row": (tm == 0).sum(1).tolist() if tm is not None else None,
        "loss_tokens_per_row": (cm * tm).sum(1).tolist() if (cm is not None and tm is not None) else None,
        "advantages": b["advantages"].tolist() if "advantages" in b else None,
        "has_sampling_logps": "sampling_per_token_logps" in b,
        "has_old_logps": "old_per_token_logps" in b,
    }
    if "sampling_per_token_logps" in b and cm is not None:
        # the rollout's recorded logprobs against TRL's own recomputation of the same tokens (same weights: the
        # batch was generated before the optimizer step, so compare with a fresh forward of the pre-step policy)
        rec["max_abs_logp_diff_on_loss_tokens"] = seen.get("logp_diff")
    rec.update(extra)
    REPORT[name] = rec
    print(f"\n===== {name} =====")
    print(json.dumps(rec, indent=1, default=str)[:6000])


def closed_turn(ids: list[int], eos: int) -> tuple[list[int], bool]:
    """Cut a sampled turn after its first end-of-turn token; say whether it had one."""
    if eos in ids:
        return ids[: ids.index(eos) + 1], True
    return ids, False


@torch.no_grad()
def policy_generate(trainer, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Sample one turn with the policy being trained (plain transformers; what TRL does without vLLM), and the
    log-probability of each sampled token under softmax(logits / temperature) -- TRL's own definition of the
    per-token logp (it divides the logits by `temperature` before log_softmax)."""
    from trl.models import unwrap_model_for_generation

    cfg = copy.deepcopy(trainer.generation_config)
    cfg.max_new_tokens = max_new_tokens
    device = trainer.accelerator.device
    ids = torch.tensor([prompt_ids], device=device)
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                     generation_kwargs=trainer.generation_kwargs) as model:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg,
                             return_dict_in_generate=True, output_logits=True)
    sampled = out.sequences[0, len(prompt_ids):].tolist()
    sampled, _ = closed_turn(sampled, trainer._tokenizer.eos_token_id)
    logps = []
    for t, tok in enumerate(sampled):
        logits = out.logits[t][0].float() / trainer.temperature
        logps.append(float(torch.log_softmax(logits, -1)[tok]))
    return sampled, logps


@torch.no_grad()
def teacher_forced_logps(trainer, prompt_ids: list[int], ids: list[int]) -> list[float]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    full = torch.tensor([prompt_ids + ids], device=trainer.accelerator.device)
    logits = model(input_ids=full).logits[0, len(prompt_ids) - 1:-1].float() / trainer.temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1).tolist()


def tool_suffix_ids(tok, name: str, content: str) -> list[int]:
    """Ids the chat template puts between an assistant turn's end-of-turn token and the next assistant turn's
    first generated token, around one tool result (TRL's `_get_tool_suffix_ids` logic, grpo_trainer.py:1893)."""
    msgs = [{"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {}}}]}]
    prefix = tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    full = tok.apply_chat_template(msgs + [{"role": "tool", "name": name, "content": content}], tokenize=True,
                                   return_dict=False, add_generation_prompt=True)
    eos = [i for i, t in enumerate(prefix) if t == tok.eos_token_id]
    prefix = prefix[: eos[-1] + 1]
    assert full[: len(prefix)] == prefix, "chat template is not prefix-preserving"
    return full[len(prefix):]


# --------------------------------------------------------------------------------------------- A: rollout_func

def run_a(close_final: bool = False) -> None:
    """`close_final`: append the template's end-of-turn token (mask 0) after a final turn cut at the token budget.
    TRL's truncation test (grpo_trainer.py:2489) only looks at the last completion id, so a closed turn counts as
    finished and keeps its loss; an open one is masked whole by mask_truncated_completions."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from flowrl.data.tokens import CallTokens, merge_calls

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir()))
    calls_seen: list[dict[str, Any]] = []

    def rollout_func(prompts: list, trainer) -> dict[str, list]:
        calls_seen.append({"n_prompts": len(prompts), "prompts": [p[-1]["content"] for p in prompts],
                           "trainer_type": type(trainer).__name__})
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "trajectory", "episode_turns", "tool_output")}
        eos = tok.eos_token_id
        for prompt in prompts:  # already repeated num_generations times by TRL's RepeatSampler
            p_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
            calls = []
            # turn 1: the model
            t1, lp1 = policy_generate(trainer, p_ids, TURN_TOKENS)
            calls.append(CallTokens(list(p_ids), t1, lp1, None))
            text1 = tok.decode(t1, skip_special_tokens=True)
            # the "tool" runs on the model's text (a real agent would parse a tool call here)
            result = f"len={len(text1)}"
            closing = [] if (t1 and t1[-1] == eos) else [eos]  # template closes a turn cut at the budget
            p2 = p_ids + t1 + closing + tool_suffix_ids(tok, "probe", result)
            # turn 2: the model again, after the tool result
            t2, lp2 = policy_generate(trainer, p2, TURN_TOKENS)
            calls.append(CallTokens(p2, t2, lp2, None))
            seqs = merge_calls(calls)
            assert len(seqs) == 1, "calls did not merge into one sequence"
            seq, n = seqs[0], len(p_ids)
            tail = [eos] if close_final and not (t2 and t2[-1] == eos) else []
            out["prompt_ids"].append(seq.input_ids[:n])
            out["completion_ids"].append(seq.input_ids[n:] + tail)
            out["env_mask"].append(seq.loss_mask[n:] + [0] * len(tail))
            out["logprobs"].append([0.0 if v is None else v for v in seq.logprobs[n:]] + [0.0] * len(tail))
            out["trajectory"].append(list(prompt) + [
                {"role": "assistant", "content": text1},
                {"role": "tool", "name": "probe", "content": result},
                {"role": "assistant", "content": tok.decode(t2, skip_special_tokens=True)}])
            out["episode_turns"].append(2)
            out["tool_output"].append(result)
        return out

    reward_kwargs_seen: dict[str, Any] = {}

    def trajectory_reward(prompts: list, completions: list, trajectory: list, tool_output: list,
                          **kwargs: Any) -> list[float]:
        reward_kwargs_seen["keys"] = sorted(kwargs)
        reward_kwargs_seen["completions_0"] = completions[0]
        reward_kwargs_seen["trajectory_0"] = trajectory[0]
        reward_kwargs_seen["env_mask_forwarded"] = "env_mask" in kwargs
        # reward from the finished episode: length of the final answer, plus the tool output's digit
        return [(len(t[-1]["content"]) % 5) / 4 + 0.01 * int(o.split("=")[1]) for t, o in zip(trajectory, tool_output)]

    trainer = GRPOTrainer(model=str(tiny_model_dir()), reward_funcs=trajectory_reward,
                          args=grpo_args("A2" if close_final else "A"),
                          processing_class=tok, train_dataset=dataset(), rollout_func=rollout_func)
    seen = spy_on(trainer)
    trainer.train()
    summarize("A2_rollout_func_closed" if close_final else "A_rollout_func", trainer, seen, {"rollout_calls": calls_seen, "reward_kwargs": reward_kwargs_seen})


# --------------------------------------------------------------------------------------------- B: environment_factory

class LookupEnv:
    """One episode's state; its public methods are the tools."""

    def reset(self, **kwargs: Any) -> str | None:
        self.answer = kwargs.get("answer")
        self.calls: list[str] = []
        return None

    def lookup(self, key: str) -> str:
        """Look up a fact.

        Args:
            key: The fact to look up, e.g. 'capital of france'.

        Returns:
            The value of the fact.
        """
        self.calls.append(key)
        return {"capital of france": "Paris"}.get(key, "unknown")

    def get_reward(self) -> float:
        return 0.5 * len(self.calls)


def run_b() -> None:
    from transformers import AutoTokenizer
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir()))
    # The tiny template writes Qwen-style <tool_call>{json}</tool_call>; TRL's add_response_schema does not know it
    # (ValueError "Unrecognized chat template"), so the response template is set by hand.
    tok.response_template = copy.deepcopy(qwen3_template)
    kwargs_seen: dict[str, Any] = {}

    def final_len(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        kwargs_seen["keys"] = sorted(kwargs)
        kwargs_seen["completions_0"] = completions[0]
        kwargs_seen["environments_0_calls"] = getattr(kwargs.get("environments", [None])[0], "calls", None)
        return [(len(c[-1].get("content") or "") % 5) / 4 for c in completions]

    trainer = GRPOTrainer(model=str(tiny_model_dir()), reward_funcs=final_len,
                          args=grpo_args("B", max_tool_calling_iterations=1, max_completion_length=128), processing_class=tok,
                          train_dataset=dataset(), environment_factory=LookupEnv)
    forced = tok.encode(FORCED_CALL, add_special_tokens=False) + [tok.eos_token_id]
    original = trainer._generate_single_turn
    state = {"first": True}

    def scripted_first_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if state["first"]:
            state["first"] = False
            return [list(forced) for _ in prompt_ids], None
        return original(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    trainer._generate_single_turn = scripted_first_turn
    seen = spy_on(trainer)
    trainer.train()
    summarize("B_environment_factory", trainer, seen,
              {"tools_exposed": [t.__name__ for t in trainer.tools], "reward_func_names": trainer.reward_func_names,
               "reward_kwargs": kwargs_seen, "forced_call_tokens": len(forced)})


# --------------------------------------------------------------------------------------------- C: the real example agent

def run_c() -> None:
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from flowrl.data.tokens import CallTokens, merge_calls
    from flowrl.demo.agent import ExampleAgent
    from flowrl.engines.chat_backend import TokensInBackend

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir()))

    class PolicyBackend(TokensInBackend):
        """flowrl's tokens-in backend, generating with the trainer's current policy; records every call."""

        def __init__(self, trainer, script: list[str]):
            super().__init__(str(tiny_model_dir()), max_new_tokens=TURN_TOKENS, temperature=trainer.temperature)
            self.trainer, self.script, self.calls = trainer, list(script), []

        def _generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
            # runs in asyncio.to_thread's worker: grad mode is thread-local, policy_generate sets no_grad itself
            if self.script:
                ids = self.tokenizer.encode(self.script.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
                logps = teacher_forced_logps(self.trainer, prompt, ids)
            else:
                ids, logps = policy_generate(self.trainer, prompt, self.max_new_tokens)
            self.calls.append(CallTokens(list(prompt), list(ids), list(logps), None))
            return ids, logps

    episodes: list[dict[str, Any]] = []

    def rollout_func(prompts: list, trainer) -> dict[str, list]:
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "agent_answer", "agent_status", "agent_messages", "merged")}
        for i, prompt in enumerate(prompts):
            backend = PolicyBackend(trainer, [FORCED_CALL])
            agent = ExampleAgent(backend)
            answer, ctx = asyncio.run(agent.a_run(prompt[-1]["content"], session_id=f"grpo-{i}", max_iterations=2,
                                                  get_ctx=True))
            seqs = merge_calls(backend.calls)
            if len(seqs) != 1:  # the agent re-rendered history differently: no single sequence (see memo, risks)
                raise RuntimeError(f"{len(seqs)} sequences from one episode")
            seq, n = seqs[0], len(backend.calls[0].prompt_ids)
            eos = backend.tokenizer.eos_token_id
            # the last reply was cut at the token budget: close it as the template would (mask 0, so TRL's
            # last-token truncation test keeps the episode; see run_a's docstring). A flowrl version would decide
            # per episode instead (see design.md).
            tail = [] if seq.input_ids[-1] == eos else [eos]
            out["prompt_ids"].append(seq.input_ids[:n])
            out["completion_ids"].append(seq.input_ids[n:] + tail)
            out["env_mask"].append(seq.loss_mask[n:] + [0] * len(tail))
            out["logprobs"].append([0.0 if v is None else v for v in seq.logprobs[n:]] + [0.0] * len(tail))
            out["agent_answer"].append(answer)
            out["agent_status"].append(getattr(ctx, "status", None))
            out["agent_messages"].append(getattr(ctx, "working_history", None))
            out["merged"].append(len(seqs))
            episodes.append({"calls": len(backend.calls), "prompt_len": n, "completion_len": len(seq.input_ids) - n,
                             "status": getattr(ctx, "status", None), "answer": answer[:60],
                             "tool_msgs": [m["content"] for m in ctx.working_history if m.get("role") == "tool"]})
        return out

    def agent_reward(prompts: list, completions: list, agent_answer: list, answer: list, **kwargs: Any) -> list[float]:
        return [1.0 if gold in got else (len(got) % 5) / 8 for got, gold in zip(agent_answer, answer)]

    trainer = GRPOTrainer(model=str(tiny_model_dir()), reward_funcs=agent_reward, args=grpo_args("C"),
                          processing_class=tok, train_dataset=dataset(), rollout_func=rollout_func)
    seen = spy_on(trainer)
    trainer.train()
    summarize("C_example_agent", trainer, seen, {"episodes": episodes})


def main() -> None:
    which = sys.argv[1:] or ["A", "A2", "B", "C"]
    shutil.rmtree(ROOT / "runs", ignore_errors=True)
    for name, fn in (("A", run_a), ("A2", lambda: run_a(close_final=True)), ("B", run_b), ("C", run_c)):
        if name not in which:
            continue
        try:
            fn()
        except Exception as exc:  # report and go on
            traceback.print_exc()
            REPORT[name + "_error"] = f"{type(exc).__name__}: {exc}"
    (ROOT / "proto_report.json").write_text(json.dumps(REPORT, indent=1, default=str))
    print("\nreport:", ROOT / "proto_report.json", "errors:", [k for k in REPORT if k.endswith("_error")])


if __name__ == "__main__":
    main()
