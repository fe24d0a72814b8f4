"""`ImproveConfig`: what one `flowrl improve` run does. Each field with a flag is also an option of the command
(`flowrl.flags.option`, made into typer options by `flowrl.cli.options`), so it is declared here once.

Light on purpose: the CLI imports it while `flowrl --help` runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flowrl.errors import FlowRLError
from flowrl.flags import option

METHOD_HELP = (
    "sft: rejection sampling on the runs graded right (STaR / ReST-EM); kto: every run, labelled by its grade; "
    "grpo: RL on each round's groups of runs, from the previous round's adapter (or --adapter)."
)
SAMPLES = {"sft": 4, "kto": 4, "grpo": 8}  # runs per train task a round: GRPO's are its groups


UNSEEN_TASKS = 60  # tasks of the held-out families that join the held-out set, by default


class ImproveError(FlowRLError):
    """The loop cannot go on as configured."""


@dataclass
class ImproveConfig:
    out: Path
    rounds: int = option(1, "--rounds -r", "Rounds of collect, score, select, train, eval.", min=1)
    samples: int | None = option(
        None, "--samples -k", "Runs per train task per round (default 4; 8 with --method grpo: its group).", min=1
    )
    method: Literal["sft", "kto", "grpo"] = option("sft", "--method -m", METHOD_HELP)
    base_model: str = option("smollm2-135m", "--base-model -b", "Model behind the agent.")
    control: Literal["unfiltered"] | None = option(
        None, "--control", "unfiltered: also train on as many runs drawn at random (right or wrong)."
    )
    temperature: float = option(0.8, "--temperature", "Sampling temperature while collecting.")
    eval_temperature: float = option(0.0, "--eval-temperature", "Temperature in eval (0: greedy).")
    concurrency: int = option(8, "--concurrency", "Agent runs at a time.", min=1)
    epochs: float = option(2.0, "--epochs", "Training epochs over the round's set.")
    max_steps: int | None = option(None, "--max-steps", "Training steps per round (instead of epochs).")
    learning_rate: float | None = option(None, "--learning-rate", "LoRA learning rate (default: the method's).")
    seed: int = option(0, "--seed", "Seed of the task split, sampling and training.")
    # the policy server's: auto, llama-server, transformers (flowrl.serve.policies)
    engine: str = option(
        "auto",
        "--engine",
        "The policy server's engine: llama-server, transformers, or auto (llama-server when built).",
    )
    slots: int = option(8, "--slots", "Sequences the engine decodes together.", min=1)
    # tokens of context a served sequence has, and so the most a training row can hold: an agent trains on what it
    # was served (a FlowAgent's prompt with its tools is about 2,500 tokens, its run summary more)
    context: int = option(
        4096,
        "--context",
        "Tokens of context per served sequence, and so the most a training row holds (a FlowAgent needs 8192).",
    )
    # the most new tokens a reply of the policy holds, whatever the agent asks (a FlowAgent asks for 16,384)
    reply_tokens: int = option(
        512, "--reply-tokens", "The most new tokens a policy's reply holds, whatever the agent asks for."
    )
    from_store: str | None = option(
        None,
        "--from-store",
        "Round 1 trains on the runs already in this store (a path or URL) and collects nothing; each run's verdict "
        "is its manual label, else the host's outcome, else the rewards. Every task is held-out.",
    )
    unlabelled: Literal["rewards", "skip", "learned"] = option(
        "rewards",
        "--unlabelled",
        "With --from-store, the verdict of a run with no manual label and no host outcome: rewards (the reward "
        "engine's), skip (none: left out), or learned (the learned reward's, fitted on the labelled runs, where "
        "it is at least --confidence sure).",
    )
    confidence: float = option(
        0.9, "--confidence", "How sure the learned reward must be to propose a label (0.5 to 1).", min=0.5, max=1.0
    )
    check_outcomes: Literal["engine", "off"] = option(
        "engine",
        "--check-outcomes",
        "With --from-store: engine leaves out a host's 'right' that its run contradicts (an error answer, every "
        "tool call failed, a number from neither the query nor a tool, an answer without its last tool's value); "
        "off takes every host outcome as it is.",
    )
    adapter: str | None = option(
        None,
        "--adapter",
        "The LoRA adapter your agent runs in production: the eval's baseline arm is the base model with it, and "
        "training goes on from its weights.",
    )
    hold_out_families: str | None = option(
        None,
        "--hold-out-families",
        "Comma-separated task families kept out of training (e.g. mulsub,summul,atomic-number); up to "
        "--unseen-tasks of their tasks join the held-out set, and eval reports them apart as unseen.",
    )
    unseen_tasks: int = option(
        UNSEEN_TASKS, "--unseen-tasks", "With --hold-out-families: their tasks added to the held-out set.", min=1
    )
    promote: bool = option(
        False,
        "--promote",
        "After each round, promote its adapter only if it beats the model promoted now on the held-out tasks "
        "(flowrl promote's rule); every decision goes into OUT/promotions.jsonl.",
    )
    # passed to hook_into_agent for your own agent (e.g. run_methods=["run"], llm_methods=[...])
    hook_options: dict[str, Any] = field(default_factory=dict)
    # more TrainingConfig fields for every round's training (e.g. per_device_train_batch_size=1)
    train_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        if self.method not in SAMPLES:
            raise ImproveError(f"--method {self.method}: use {', '.join(SAMPLES)}")
        if self.samples is None:
            self.samples = SAMPLES[self.method]
        if self.rounds < 1 or self.samples < 1:
            raise ImproveError(f"rounds {self.rounds} and samples {self.samples}: use at least 1 of each")
        if self.control not in (None, "unfiltered"):
            raise ImproveError(f"--control {self.control}: use unfiltered")
        self._check_grpo()
        if self.temperature <= 0:
            raise ImproveError("collecting needs sampling: use a --temperature above 0")
        if self.reply_tokens < 1 or self.reply_tokens >= self.context:
            raise ImproveError(f"--reply-tokens {self.reply_tokens}: use 1 to fewer than --context {self.context}")
        self._check_from_store()
        if not 0.5 <= self.confidence <= 1.0:
            raise ImproveError(f"--confidence {self.confidence}: use 0.5 to 1")
        if self.adapter is not None and not (Path(self.adapter) / "adapter_config.json").is_file():
            raise ImproveError(f"--adapter {self.adapter}: no adapter_config.json there; pass a LoRA adapter's folder")
        if self.context < 256:
            raise ImproveError(f"--context {self.context}: use at least 256 tokens (an agent's prompt needs room)")

    def _check_grpo(self) -> None:
        if self.method != "grpo":
            return
        if self.runs_per_task < 2:
            raise ImproveError(
                f"--method grpo with --samples {self.samples}: a group needs at least 2 runs (8 is usual)"
            )
        if self.control is not None:
            raise ImproveError(
                "--control unfiltered with --method grpo: the control is SFT on unfiltered runs; compare GRPO with "
                "its starting adapter instead (--adapter, the eval's base arm)"
            )

    def _check_from_store(self) -> None:
        if self.unlabelled not in ("rewards", "skip", "learned"):
            raise ImproveError(f"--unlabelled {self.unlabelled}: use rewards, skip or learned")
        if self.check_outcomes not in ("engine", "off"):
            raise ImproveError(f"--check-outcomes {self.check_outcomes}: use engine or off")
        if self.from_store is None:
            if self.unlabelled != "rewards":
                raise ImproveError(f"--unlabelled {self.unlabelled} goes with --from-store (collected runs are graded)")
            return
        if self.method == "grpo":
            raise ImproveError("--method grpo with --from-store: GRPO learns from groups it samples; drop --from-store")
        if self.rounds > 1:
            raise ImproveError(
                f"--from-store with --rounds {self.rounds}: later rounds on a store's own queries are not built yet; "
                "use --rounds 1"
            )
        if self.hold_out_families is not None:
            raise ImproveError(
                "--hold-out-families with --from-store: the store's runs are trained on as recorded; hold families "
                "out when collecting (drop --from-store)"
            )

    @property
    def unseen_families(self) -> frozenset[str]:
        """The families `--hold-out-families` keeps out of training."""
        return frozenset(f.strip() for f in (self.hold_out_families or "").split(",") if f.strip())

    @property
    def runs_per_task(self) -> int:
        """`samples`, or the method's default (a GRPO round's group size)."""
        return self.samples if self.samples is not None else SAMPLES[self.method]
