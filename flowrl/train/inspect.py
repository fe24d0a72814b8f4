"""`flowrl dataset show`: a dataset row as the trainer will see it, token by token, with its loss mask.

The row is encoded exactly as `flowrl train` encodes it (`flowrl.data.encode`), with the base model's
tokenizer: captured ids where the run has them, else the chat template. `loss_mask` is 1 where the trainer
puts loss. Wrong masks are the first thing users of agent RL hit (TRL issues #4974, #5144); this shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.data.encode import EncodeStats, TokenBudget, row_sequences
from flowrl.errors import ConfigError
from flowrl.methods import canonical_method
from flowrl.models import resolve_model
from flowrl.train.data_io import load_dataset_dir
from flowrl.train.trainers import chat_renderer


@dataclass
class ShownRow:
    method: str
    split: str
    index: int
    rows: int
    sequences: list[dict[str, Any]]  # {"input_ids", "loss_mask", "text", "source", "tokens"}
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        """`{"input_ids", "loss_mask", "text"}` for one sequence, `{"sequences": [...]}` for several."""
        plain = [{k: s[k] for k in ("input_ids", "loss_mask", "text")} for s in self.sequences]
        return plain[0] if len(plain) == 1 else {"sequences": plain}


def _split(path: Path, split: str) -> tuple[Any, dict[str, Any]]:
    data = load_dataset_dir(path)
    if split == "train":
        return data.train, data.meta
    if split in ("validation", "eval", "test"):
        if data.eval is None:
            raise ConfigError(f"dataset {path} has no validation split: use --split train")
        return data.eval, data.meta
    raise ConfigError(f"--split {split}: use train or validation")


def show_row(
    path: Path | str, *, base_model: str | None = None, row: int = 0, split: str = "train", method: str | None = None
) -> ShownRow:
    """Encode row `row` of `split` of the dataset at `path` with `base_model`'s tokenizer."""
    path = Path(path).expanduser()
    dataset, meta = _split(path, split)
    method = canonical_method(method or str(meta.get("method") or ""))
    if not method:
        raise ConfigError(f"dataset {path} does not say its method (no flowrl_dataset.json): pass --method")
    if not 0 <= row < len(dataset):
        raise ConfigError(f"--row {row}: the {split} split of {path} has rows 0 to {len(dataset) - 1}")
    renderer = _renderer(base_model)
    tokenizer = renderer.tokenizer
    stats = EncodeStats(render=renderer.stats)
    sequences = row_sequences(method, dataset[row], renderer, stats)
    shown = []
    for seq in sequences:
        shown.append(
            {
                "input_ids": seq.input_ids,
                "loss_mask": seq.loss_mask,
                "source": seq.source,
                "text": tokenizer.decode(seq.input_ids),
                "tokens": [tokenizer.decode([t]) for t in seq.input_ids],
            }
        )
    return ShownRow(method, split, row, len(dataset), shown, list(renderer.stats.notes))


def token_budget(method: str, base_model: str, max_length: int) -> Any:
    """A `TokenBudget` for `build-dataset --base-model M --max-length N`."""
    if max_length < 8:
        raise ConfigError(f"--max-length {max_length}: use at least 8 tokens")
    return TokenBudget(method, _renderer(base_model), max_length)


def _renderer(base_model: str | None) -> Any:
    resolved = resolve_model(base_model)
    return chat_renderer(resolved.path, label=resolved.spec)
