"""TRL's KTO and DPO trainers fed with rows that are already tokens.

KTOTrainer and DPOTrainer always tokenize `prompt`/`completion` (`chosen`/`rejected`) themselves, with the
chat template, and cannot take the ids the model really sampled. These subclasses change one thing: when
the rows already hold `prompt_ids` and `completion_ids` (KTO) or `prompt_ids`, `chosen_ids` and
`rejected_ids` (DPO), built by `flowrl.data.encode`, the tokenizing step is skipped. Everything after it is
TRL's: KTO's KL pairs and class-balance check, the collators (loss on every completion token, none on the
prompt), the losses. Over-long rows were already dropped and counted by flowrl, so TRL's own length filter
finds nothing to drop.
"""

from __future__ import annotations

from typing import Any

from flowrl.errors import require

# per encoding: the token columns of its rows, and TRL's trainer that takes them by default
PRE_TOKENIZED = {
    "kto": (("prompt_ids", "completion_ids"), "KTOTrainer"),
    "dpo": (("prompt_ids", "chosen_ids", "rejected_ids"), "DPOTrainer"),
}


def _is_tokenized(dataset: Any, method: str) -> bool:
    return set(PRE_TOKENIZED[method][0]) <= set(dataset.column_names)


def pretokenized_trainer(method: str, base: type | None = None) -> type:
    """A subclass of `base` (TRL's KTOTrainer or DPOTrainer by default) that accepts rows tokenized the `method`
    way ("kto": prompt_ids/completion_ids, "dpo": prompt_ids/chosen_ids/rejected_ids)."""
    if base is None:
        trl = require("trl")
        base = getattr(trl, PRE_TOKENIZED[method][1])

    class PreTokenized(base):  # type: ignore[misc, valid-type]
        def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
            if not _is_tokenized(dataset, method):
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if getattr(self, "calculate_KL", False):  # only KTOTrainer has it
                # TRL's own KL pairing (kto_trainer._prepare_dataset): completions rotated by one within a batch
                def add_kl_completion_ids(examples: dict[str, Any]) -> dict[str, Any]:
                    examples["KL_completion_ids"] = [examples["completion_ids"][-1]] + examples["completion_ids"][:-1]
                    return examples

                dataset = dataset.map(add_kl_completion_ids, batched=True, batch_size=args.per_device_train_batch_size)
            return dataset

    PreTokenized.__name__ = f"PreTokenized{base.__name__}"
    PreTokenized.__qualname__ = PreTokenized.__name__
    return PreTokenized
