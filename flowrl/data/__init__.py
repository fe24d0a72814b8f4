"""Dataset builders: traces in, TRL's own dataset formats out (KTO, GRPO online/offline, SFT, DPO).

Importing this package is light: `datasets` is imported only when a dataset is written or described.
See docs/datasets.md for each method's row format.
"""

from __future__ import annotations

from flowrl.data.base import BuildStats, DatasetBuilder, DatasetFilter, effective_label
from flowrl.data.conversation import Conversation, normalize_query, trace_conversation
from flowrl.data.dpo import DPODatasetBuilder
from flowrl.data.grouping import Grouper
from flowrl.data.grpo import GRPODatasetBuilder
from flowrl.data.kto import KTODatasetBuilder, kto_weights
from flowrl.data.pipeline import METADATA_FILE, BuildResult, DatasetError, DatasetPipeline
from flowrl.data.sft import SFTDatasetBuilder
from flowrl.data.split import split_for

METHODS: tuple[str, ...] = ("kto", "grpo", "grpo-offline", "sft", "dpo")


def make_builder(method: str, **options: object) -> DatasetBuilder:
    """The builder for a method name (`kto`, `grpo`, `grpo-offline`, `sft`, `dpo`)."""
    from flowrl.errors import ConfigError

    if method == "kto":
        return KTODatasetBuilder(**options)  # type: ignore[arg-type]
    if method in ("grpo", "grpo-offline"):
        return GRPODatasetBuilder(offline=method == "grpo-offline", **options)  # type: ignore[arg-type]
    if method == "sft":
        return SFTDatasetBuilder(**options)  # type: ignore[arg-type]
    if method == "dpo":
        return DPODatasetBuilder(**options)  # type: ignore[arg-type]
    raise ConfigError(f"method {method!r}: use one of {', '.join(METHODS)}")


__all__ = [
    "METADATA_FILE", "METHODS", "BuildResult", "BuildStats", "Conversation", "DPODatasetBuilder", "DatasetBuilder",
    "DatasetError", "DatasetFilter", "DatasetPipeline", "GRPODatasetBuilder", "Grouper", "KTODatasetBuilder",
    "SFTDatasetBuilder", "effective_label", "kto_weights", "make_builder", "normalize_query", "split_for",
    "trace_conversation",
]
