"""`evaluate`: answer held-out prompts with a model (and a baseline), score the answers, report both.

Prompts come from the validation split of a flowrl dataset folder (the train split, with a warning, when
there is none) or from a JSONL file of `{"prompt": str | [messages], "reference_answer"?: ..., ...}` rows.
A row's reference answer is `flowrl.trace.facts.reference_in` (the keys and order every reader uses); an answer a
dataset took from a logged run (a GRPO `reference_source = "best_trace"`, DPO `chosen`, a KTO completion, an
SFT reply) is a guess, never a reference.
Each answer becomes an `ExecutionTrace` (the prompt's user turn as `user_query`, the answer as
`final_response` and as the last of `messages`, the row's reference answer and other columns in `metadata`)
and is scored by flowrl's `RewardEngine`. Generation is greedy, so two runs give the same report.

Writes `eval_report.json` ({model, baseline, n_prompts, per_reward: {name: {baseline, model, judged}},
combined: {baseline, model}, samples: [...]}) and `eval_report.png` (bars per reward) into `out_dir`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, require
from flowrl.models import ResolvedModel, adapter_base, load_for_inference, resolve_model
from flowrl.rewards.base import prompt_text
from flowrl.rewards.engine import RewardEngine
from flowrl.trace.facts import REFERENCE_KEYS, reference_in
from flowrl.trace.schema import ExecutionTrace
from flowrl.train.data_io import load_dataset_dir
from flowrl.version import __version__

log = logging.getLogger(__name__)

REPORT_JSON = "eval_report.json"
REPORT_PNG = "eval_report.png"


@dataclass
class EvalPrompt:
    messages: list[dict[str, Any]]
    reference: str | None = None
    tools: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def query(self) -> str:
        return prompt_text(self.messages)


@dataclass
class EvalReport:
    model: str
    baseline: str | None
    n_prompts: int
    per_reward: dict[str, dict[str, Any]]
    combined: dict[str, float | None]
    samples: list[dict[str, Any]]
    prompts_source: str = ""
    split: str | None = None
    max_new_tokens: int = 0
    seconds: float = 0.0
    flowrl_version: str = __version__

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- prompts


def _as_messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, list):
        return [m for m in prompt if isinstance(m, dict)]
    if isinstance(prompt, dict) and "role" in prompt:
        return [prompt]
    return [{"role": "user", "content": str(prompt)}]


def _row_prompt(row: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """The prompt messages of a row in any of TRL's formats, and its reference answer (`reference_in`)."""
    reference = reference_in(row)
    if row.get("prompt") is not None:
        return _as_messages(row["prompt"]), reference
    if row.get("messages"):
        messages = _as_messages(row["messages"])
        first_assistant = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        return messages[:first_assistant], reference
    raise ConfigError(f"a prompt row has neither `prompt` nor `messages` (columns: {', '.join(sorted(row))})")


def load_prompts(source: Path | str, *, limit: int | None = None) -> tuple[list[EvalPrompt], str | None]:
    """Held-out prompts (deduplicated, in order) and the split they came from (None for a JSONL file)."""
    path = Path(source).expanduser()
    data = load_dataset_dir(path)
    split: str | None = None
    if path.is_dir():
        if data.eval is not None:
            rows, split = data.eval.to_list(), "validation"
        else:
            log.warning("flowrl: %s has no validation split: evaluating on its training prompts", path)
            rows, split = data.train.to_list(), "train"
    else:
        rows = data.train.to_list()
    prompts: list[EvalPrompt] = []
    seen: dict[str, EvalPrompt] = {}
    for row in rows:
        messages, reference = _row_prompt(row)
        if not any(m.get("role") == "user" for m in messages):
            continue
        key = json.dumps(messages, sort_keys=True, default=str)
        if key in seen:  # a later row of the same prompt may carry the reference the first one lacked
            if seen[key].reference is None:
                seen[key].reference = reference
            continue
        extra = {
            k: v
            for k, v in row.items()
            if k
            not in (
                "prompt",
                "messages",
                "chosen",
                "rejected",
                "completion",
                "completions",
                "tools",
                "reference_source",
                *REFERENCE_KEYS,
            )
            and isinstance(v, (str, int, float, bool, type(None)))
        }
        prompts.append(EvalPrompt(messages, reference, row.get("tools") or None, extra))
        seen[key] = prompts[-1]
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise ConfigError(f"no prompt with a user turn in {path}")
    return prompts, split


# --------------------------------------------------------------------------- generation and scoring


def generate_answers(
    resolved: ResolvedModel, prompts: list[EvalPrompt], *, max_new_tokens: int = 128, batch_size: int = 8
) -> list[str]:
    """Greedy answers of one model to every prompt, batched with left padding."""
    torch = require("torch")
    model, tokenizer = load_for_inference(resolved)
    device = next(model.parameters()).device
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        texts = [
            tokenizer.apply_chat_template(p.messages, tools=p.tools, add_generation_prompt=True, tokenize=False)
            for p in chunk
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        answers.extend(tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    del model
    return [a.strip() for a in answers]


def answer_trace(prompt: EvalPrompt, answer: str) -> ExecutionTrace:
    metadata: dict[str, Any] = dict(prompt.metadata)
    if prompt.reference is not None:
        metadata["reference_answer"] = prompt.reference
    metadata["grpo_columns"] = dict(metadata)  # where rewards look for GRPO dataset columns
    return ExecutionTrace(
        user_query=prompt.query,
        final_response=answer,
        messages=[*prompt.messages, {"role": "assistant", "content": answer}],
        tools=prompt.tools or [],
        source="live",
        metadata=metadata,
    )


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def evaluate(  # noqa: PLR0913  # keyword-only options of `flowrl eval --prompts`
    model: str,
    prompts: Path | str,
    *,
    baseline: str | None = None,
    out_dir: Path | str | None = None,
    max_new_tokens: int = 128,
    limit: int | None = None,
    batch_size: int = 8,
    reward_config: Path | None = None,
    rewards: list[str] | None = None,
) -> EvalReport:
    """Generate, score and report for `model` and (if any) `baseline`. See the module docstring."""
    started = time.perf_counter()
    subjects: dict[str, ResolvedModel] = {"model": resolve_model(model)}  # first: a wrong --model fails at once
    if baseline is None:
        baseline = default_baseline(model)
    if baseline:
        subjects["baseline"] = resolve_model(baseline)
    items, split = load_prompts(prompts, limit=limit)
    engine = RewardEngine.from_config(reward_config) if reward_config else RewardEngine()
    names = rewards or engine.names
    unknown = [n for n in names if n not in engine.rewards]
    if unknown:
        raise ConfigError(f"unknown reward {', '.join(unknown)}: choose from {', '.join(engine.names)}")

    per_subject: dict[str, dict[str, Any]] = {}
    with engine:  # closes every reward (sandbox workers, judge clients) at the end
        chosen = RewardEngine(
            {n: engine.rewards[n] for n in names}, {n: engine.weights[n] for n in names}, engine.threshold
        )  # computes only the rewards asked for
        for role, resolved in subjects.items():
            answers = generate_answers(resolved, items, max_new_tokens=max_new_tokens, batch_size=batch_size)
            results = chosen.compute_batch([answer_trace(p, a) for p, a in zip(items, answers)])
            scores = [{n: r[n].value for n in names} for r in results]
            per_subject[role] = {
                "answers": answers,
                "scores": scores,
                "combined": [chosen.compute_combined(r) for r in results],
            }

    per_reward: dict[str, dict[str, Any]] = {}
    for n in names:
        entry: dict[str, Any] = {"baseline": None, "model": None, "judged": {}}
        for role, res in per_subject.items():
            values = [s[n] for s in res["scores"]]
            entry[role] = _mean(values)
            entry["judged"][role] = sum(v is not None for v in values)
        per_reward[n] = entry
    combined: dict[str, float | None] = {"baseline": None, "model": None}
    for role, res in per_subject.items():
        combined[role] = _mean(res["combined"])

    samples = []
    for i, p in enumerate(items):
        sample: dict[str, Any] = {"prompt": p.query, "reference": p.reference}
        for role, res in per_subject.items():
            sample[role] = {"answer": res["answers"][i], "rewards": res["scores"][i], "combined": res["combined"][i]}
        samples.append(sample)

    report = EvalReport(
        model=subjects["model"].spec,
        baseline=subjects["baseline"].spec if "baseline" in subjects else None,
        n_prompts=len(items),
        per_reward=per_reward,
        combined=combined,
        samples=samples,
        prompts_source=str(prompts),
        split=split,
        max_new_tokens=max_new_tokens,
        seconds=round(time.perf_counter() - started, 2),
    )
    if out_dir is not None:
        write_report(report, Path(out_dir))
    return report


def default_baseline(model: str) -> str | None:
    """What a trained model is compared with when no --baseline is given: the base model it was trained from."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    for folder in (path, path.parent):
        record = folder / "flowrl_train.json"
        if record.is_file():
            try:
                return json.loads(record.read_text(encoding="utf-8"))["base_model"]["spec"]
            except (OSError, ValueError, KeyError, TypeError):
                break
    if (path / "adapter_config.json").is_file():
        return adapter_base(path)
    return None


# --------------------------------------------------------------------------- report files


def write_report(report: EvalReport, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / REPORT_JSON
    json_path.write_text(
        json.dumps(report.to_json_dict(), indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8"
    )
    png_path = out_dir / REPORT_PNG
    plot_report(report, png_path)
    return json_path, png_path


def plot_report(report: EvalReport, path: Path) -> Path:
    """Grouped bars: mean of each reward (and the combined score) for the baseline and the model."""
    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = list(report.per_reward) + ["combined"]
    rows = {**report.per_reward, "combined": report.combined}
    roles = [r for r in ("baseline", "model") if r == "model" or report.baseline]
    width = 0.8 / len(roles)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.0))
    for k, role in enumerate(roles):
        values = [rows[name].get(role) for name in labels]
        xs = [i + (k - (len(roles) - 1) / 2) * width for i in range(len(labels))]
        name = report.baseline if role == "baseline" else report.model
        bars = ax.bar(xs, [v if v is not None else 0.0 for v in values], width, label=f"{role}: {Path(str(name)).name}")
        for bar, v in zip(bars, values):
            ax.annotate(
                "n/a" if v is None else f"{v:.2f}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right")
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("mean reward (0-1)")
    ax.set_title(f"flowrl eval: {report.n_prompts} prompts")
    ax.legend(loc="upper center", ncol=len(roles), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
