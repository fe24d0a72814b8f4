"""Training methods: one table, one `MethodSpec` per method.

A spec names everything a method needs, by import path so this module imports nothing heavy:
the dataset builder (and its fixed options), TRL's config and trainer classes, how flowrl encodes
its conversational rows (`encoding`: a key of `ENCODINGS`, "sft", "kto", "dpo", "grpo-offline", or None for rows
TRL takes as they are), the columns a dataset must have, the LoRA learning rate and a line for the dataset card.
Code elsewhere asks the spec what the method does (`is_grpo`, `online`, `needs_rewards`, `trains_on_right_runs`,
`encoding_spec.class_weights`, ...), never its name, so a method that reuses an encoding inherits its behaviour.

Adding a method is one file (its builder, if no existing one fits) and one line:

    register_method(MethodSpec("orpo", builder="flowrl.data.dpo:DPODatasetBuilder", trl_config="ORPOConfig",
                               trl_trainer="ORPOTrainer", trl_module="trl.experimental.orpo", encoding="dpo",
                               required_columns=(("prompt",), ("chosen",), ("rejected",)), learning_rate=5e-5,
                               card_format="preference pairs for ORPO"))

`flowrl build-dataset --method orpo` and `flowrl train --method orpo` then work.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from flowrl.errors import ConfigError, require


@dataclass(frozen=True)
class Encoding:
    """What training asks of one way of encoding rows (`MethodSpec.encoding`); flowrl.data.encode has its encoder."""

    name: str
    conversation_column: str | None = None  # holding a list there marks conversational rows flowrl tokenizes
    pretokenized_trainer: bool = (
        False  # TRL's trainer always tokenizes: subclass it to take the ids (train.pretokenized)
    )
    takes_beta: bool = True  # TRL's config has a `beta` (SFT's has none)
    class_weights: bool = False  # desirable / undesirable weights (KTO)
    kl_pairs: bool = False  # the KL estimate pairs each row with another row of its batch (KTO)
    assistant_masks: bool = False  # rows carry a per-token loss mask: `assistant_only_loss` applies, no packing (SFT)
    replays_groups: bool = False  # logged completion groups replayed through a GRPO rollout_func

    @property
    def min_batch_rows(self) -> int:
        return 2 if self.kl_pairs else 1


AS_IS = Encoding("as-is")  # rows TRL takes as they are (online GRPO prompts)
ENCODINGS: dict[str, Encoding] = {
    e.name: e
    for e in (
        Encoding("sft", conversation_column="messages", takes_beta=False, assistant_masks=True),
        Encoding("kto", conversation_column="prompt", pretokenized_trainer=True, class_weights=True, kl_pairs=True),
        Encoding("dpo", conversation_column="prompt", pretokenized_trainer=True),
        Encoding("grpo-offline", replays_groups=True),
    )
}


@dataclass(frozen=True)
class MethodSpec:
    name: str
    builder: str  # "module:Class" of the DatasetBuilder
    trl_config: str  # class names in `trl_module`
    trl_trainer: str
    required_columns: tuple[tuple[str, ...], ...]  # each: one of these columns
    learning_rate: float  # for LoRA adapters; full fine-tuning uses a tenth
    card_format: str
    builder_options: dict[str, Any] = field(default_factory=dict)
    encoding: str | None = None  # how flowrl tokenizes conversational rows (see flowrl.data.encode)
    trl_module: str = "trl"
    aliases: tuple[str, ...] = ()
    # rejection sampling: the builder options that keep only the runs labelled right (SFT: select="label");
    # None: the method learns from every labelled run, right and wrong (KTO's labels, DPO's pairs)
    right_runs_only: dict[str, Any] | None = None

    @property
    def is_grpo(self) -> bool:
        """A GRPO method (online or offline): it has completions generated or replayed and scored."""
        return self.trl_config == "GRPOConfig"

    @property
    def online(self) -> bool:
        """GRPO whose completions are generated while training (rows TRL takes as they are): an agent can roll out."""
        return self.is_grpo and self.encoding is None

    @property
    def needs_rewards(self) -> bool:
        """Its dataset is built from scored or labelled traces (online GRPO scores while it trains)."""
        return not self.online

    @property
    def trains_on_right_runs(self) -> bool:
        return self.right_runs_only is not None

    @property
    def encoding_spec(self) -> Encoding:
        """What training asks of the method's `encoding` (flowrl.methods.ENCODINGS)."""
        if self.encoding is None:
            return AS_IS
        if self.encoding not in ENCODINGS:
            raise ConfigError(f"method {self.name!r}: no encoding {self.encoding!r}; use one of {', '.join(ENCODINGS)}")
        return ENCODINGS[self.encoding]

    def builder_class(self) -> type:
        module, _, name = self.builder.partition(":")
        return getattr(importlib.import_module(module), name)

    def trl_classes(self) -> tuple[type, type]:
        require("trl")
        module = importlib.import_module(self.trl_module)
        return getattr(module, self.trl_config), getattr(module, self.trl_trainer)


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add (or replace) a method in the table."""
    METHODS[spec.name] = spec
    return spec


def make_builder(method: str, **options: Any) -> Any:
    """The dataset builder of `method`, with the method's fixed options and yours."""
    spec = get_method(method)
    builder = spec.builder_class()(**spec.builder_options, **options)
    builder.method_name = spec.name  # a method may reuse another's builder: the dataset says which method
    builder.card_format = spec.card_format
    return builder


def method_names() -> tuple[str, ...]:
    return tuple(METHODS)


def canonical_method(name: str) -> str:
    """`name` as the table spells it (case, `_` for `-` and aliases forgiven)."""
    wanted = str(name).strip().lower().replace("_", "-")
    for spec in METHODS.values():
        if wanted == spec.name or wanted in spec.aliases:
            return spec.name
    return wanted


def get_method(name: str) -> MethodSpec:
    spec = METHODS.get(canonical_method(name))
    if spec is None:
        raise ConfigError(f"method {name!r}: use one of {', '.join(METHODS)}")
    return spec


_CONVERSATION = (("prompt",),)
# GRPO's LoRA learning rate. It was 1e-5: in bench_grpo_vs_sft (2026-11-24) the policy barely moved (mean KL 0.0014
# over 50 steps) while SFT's 2e-4 learned in 6; 1e-4 is what LoRA RL recipes (ART, TRL's agent examples) use.
GRPO_LEARNING_RATE = 1e-4
for _spec in (
    MethodSpec(
        "grpo",
        "flowrl.data.grpo:GRPODatasetBuilder",
        "GRPOConfig",
        "GRPOTrainer",
        _CONVERSATION,
        GRPO_LEARNING_RATE,
        "prompt-only: `prompt` (conversational) plus reward-function columns, for TRL's `GRPOTrainer`",
        builder_options={"offline": False},
        aliases=("grpo-online", "online-grpo"),
    ),
    MethodSpec(
        "grpo-offline",
        "flowrl.data.grpo:GRPODatasetBuilder",
        "GRPOConfig",
        "GRPOTrainer",
        _CONVERSATION,
        GRPO_LEARNING_RATE,
        "logged groups: `prompt`, `logged_completions`, `logged_rewards` (+ `logged_tokens`), replayed through "
        "a `GRPOTrainer` `rollout_func`",
        builder_options={"offline": True},
        encoding="grpo-offline",
        aliases=("offline-grpo",),
    ),
    MethodSpec(
        "kto",
        "flowrl.data.kto:KTODatasetBuilder",
        "KTOConfig",
        "KTOTrainer",
        (("prompt",), ("completion",), ("label",)),
        5e-5,
        "unpaired preference: `prompt` / `completion` / `label` (conversational, + `captured` ids), for TRL's "
        "`KTOTrainer`",
        encoding="kto",
    ),
    MethodSpec(
        "sft",
        "flowrl.data.sft:SFTDatasetBuilder",
        "SFTConfig",
        "SFTTrainer",
        (("messages", "text", "prompt"),),
        2e-4,
        "language modelling: `messages` (+ `tools`, `prompt_end`, `captured` ids), for TRL's `SFTTrainer` "
        "with loss on the tokens generated in the run",
        encoding="sft",
        right_runs_only={"select": "label"},
    ),
    MethodSpec(
        "dpo",
        "flowrl.data.dpo:DPODatasetBuilder",
        "DPOConfig",
        "DPOTrainer",
        (("chosen",), ("rejected",)),
        5e-5,
        "preference: `prompt` / `chosen` / `rejected` (conversational, + `captured` ids), for TRL's `DPOTrainer`",
        encoding="dpo",
    ),
):
    register_method(_spec)
