"""`flowrl build-dataset`'s options, declared once: each field of `BuildOptions` is an option of the command
(`flowrl.flags.option`, made into typer options by `flowrl.cli.options.config_options`), and the dataclass
turns them into what the library takes: a builder (`flowrl.methods.make_builder`), the filters and the
`DatasetPipeline`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flowrl.cli.traces import _date
from flowrl.errors import ConfigError
from flowrl.flags import option

if TYPE_CHECKING:
    from flowrl.data import DatasetFilter, DatasetPipeline
    from flowrl.data.grouping import GroupBy

METHOD_HELP = "kto, grpo (online prompts), grpo-offline (logged groups), sft or dpo."

# a method's own options: the builder's field -> the option's field (flowrl.data's builders)
BUILDER_OPTIONS = {
    "rows": "kto_rows",
    "threshold": "threshold",
    "min_group_size": "min_group_size",
    "max_group_size": "max_group_size",
    "select": "select",
    "top_share": "top_share",
    "min_margin": "min_margin",
}


@dataclass(frozen=True)
class BuildOptions:
    """What to build and from which traces (each field is a flag of `flowrl build-dataset`)."""

    method: str = option(..., "--method -m", METHOD_HELP)
    out: Path = option(..., "--out -o", "Output folder (created; must be empty unless --overwrite).")
    # which traces (flowrl.data.DatasetFilter)
    since: str | None = option(None, "--since", "First day, YYYY-MM-DD.")
    until: str | None = option(None, "--until", "Last day, YYYY-MM-DD.")
    agent: str | None = option(None, "--agent", "Only this agent.")
    source: str | None = option(None, "--source", "Only this source: live, checkpoint, obs, live-file or import.")
    min_reward: float | None = option(None, "--min-reward", "Only traces with reward_score >= this.")
    max_reward: float | None = option(None, "--max-reward", "Only traces with reward_score <= this.")
    label_source: str | None = option(None, "--label-source", "Only traces labelled this way: manual or engine.")
    dedupe: bool = option(True, "--dedupe/--no-dedupe", "Drop traces whose conversation repeats an earlier one.")
    # grouping and split (flowrl.data.DatasetPipeline, which checks them)
    group_by: str = option("query", "--group-by", "What makes two traces the same task: query, group_key or embedding.")
    similarity: float = option(0.9, "--similarity", "Cosine similarity for --group-by embedding.")
    embedding_model: str | None = option(
        None, "--embedding-model", "Local sentence-transformers folder for --group-by embedding."
    )
    val_fraction: float = option(0.1, "--val-fraction", "Share of tasks (groups) held out for validation; 0 for none.")
    seed: int = option(0, "--seed", "Seed of the split and of KTO's shuffle.")
    # rows
    max_chars: int = option(
        32000, "--max-chars", "Length budget of a row in characters (0: none); truncations are counted."
    )
    base_model: str | None = option(
        None, "--base-model -b", "Measure rows in this model's tokens and drop (and list) those over --max-length."
    )
    max_length: int = option(
        1024,
        "--max-length",
        "Token budget per sequence with --base-model (default: the CPU training profile's 1024).",
    )
    arguments: str = option("dict", "--arguments", "Tool-call arguments as dict (HF templates) or string (OpenAI).")
    workers: int = option(
        1,
        "--workers",
        "KTO from a segment store: make the rows in this many more processes (others say so and use one).",
    )
    # a method's own (BUILDER_OPTIONS): None leaves the builder's default
    kto_rows: str | None = option(
        None, "--kto-rows", "KTO: one row per assistant 'step' (default) or per 'final' turn."
    )
    threshold: float | None = option(
        None, "--threshold", "KTO: label = reward_score >= this (manual labels still win)."
    )
    min_group_size: int | None = option(None, "--min-group-size", "grpo-offline: smallest group kept (default 2).")
    max_group_size: int | None = option(
        None, "--max-group-size", "grpo-offline: largest group (default 16; 0: no cap)."
    )
    select: str | None = option(
        None, "--select", "SFT: top (top share by reward, default), label (label true) or best (per task)."
    )
    top_share: float | None = option(None, "--top-share", "SFT --select top: share of traces kept (default 0.25).")
    min_margin: float | None = option(
        None, "--min-margin", "DPO: smallest reward margin between chosen and rejected (default 0.1)."
    )

    def builder(self) -> Any:
        """The method's builder with the options given; a ConfigError names those that do not apply to it."""
        from flowrl.methods import make_builder  # lazy: keeps `flowrl --help` fast

        given: dict[str, Any] = {}
        for name, field_name in BUILDER_OPTIONS.items():
            value = getattr(self, field_name)
            if value is not None:
                given[name] = value
        if given.get("max_group_size") == 0:
            given["max_group_size"] = None
        builder = make_builder(self.method, max_chars=self.max_chars or None, arguments_as=self.arguments)
        fields = {f.name for f in dataclasses.fields(builder)}
        wrong = [_flag(BUILDER_OPTIONS[k]) for k in given if k not in fields]
        if wrong:
            raise ConfigError(f"{', '.join(wrong)} does not apply to --method {self.method}")
        if given:
            builder = dataclasses.replace(builder, **given)
        return builder

    def filters(self) -> DatasetFilter:
        from flowrl.data import DatasetFilter  # lazy: keeps `flowrl --help` fast

        return DatasetFilter(
            since=_date(self.since, "since"),
            until=_date(self.until, "until"),
            agent=self.agent,
            source=self.source,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
            label_source=self.label_source,
            dedupe=self.dedupe,
        )

    def pipeline(self, builder: Any, filters: DatasetFilter) -> DatasetPipeline:
        """The pipeline of `builder` over `filters`, measuring rows in `base_model`'s tokens when one is given."""
        from flowrl.data import DatasetPipeline  # lazy: keeps `flowrl --help` fast

        budget = None
        if self.base_model is not None:
            from flowrl.train.inspect import token_budget  # lazy: keeps `flowrl --help` fast

            budget = token_budget(builder.method, self.base_model, self.max_length)
        return DatasetPipeline(
            builder,
            filters=filters,
            group_by=cast("GroupBy", self.group_by),  # checked by the pipeline, which names the allowed values
            similarity=self.similarity,
            embedding_model=self.embedding_model,
            val_fraction=self.val_fraction,
            seed=self.seed,
            budget=budget,
            workers=self.workers,
        )


def _flag(name: str) -> str:
    """The flag of a field of BuildOptions, without its short form ("--kto-rows")."""
    return next(f.metadata["flag"].split()[0] for f in dataclasses.fields(BuildOptions) if f.name == name)
