"""Dataset builders: traces in, TRL's own dataset formats out (KTO, GRPO online/offline, SFT, DPO).

Importing this package is light: `datasets` is imported only when a dataset is written or described.
See docs/datasets.md for each method's row format.
"""

from __future__ import annotations

from flowrl.data.base import BuildStats, DatasetBuilder, DatasetFilter, effective_label
from flowrl.data.dpo import DPODatasetBuilder
from flowrl.data.grouping import Grouper
from flowrl.data.grpo import GRPODatasetBuilder
from flowrl.data.kto import KTODatasetBuilder, kto_weights
from flowrl.data.pipeline import METADATA_FILE, BuildResult, DatasetError, DatasetPipeline
from flowrl.data.sft import SFTDatasetBuilder
from flowrl.data.split import split_for
from flowrl.trace.conversation import Conversation, normalize_query, trace_conversation

__all__ = [
    "METADATA_FILE",
    "BuildResult",
    "BuildStats",
    "Conversation",
    "DPODatasetBuilder",
    "DatasetBuilder",
    "DatasetError",
    "DatasetFilter",
    "DatasetPipeline",
    "GRPODatasetBuilder",
    "Grouper",
    "KTODatasetBuilder",
    "SFTDatasetBuilder",
    "effective_label",
    "kto_weights",
    "normalize_query",
    "split_for",
    "trace_conversation",
]
