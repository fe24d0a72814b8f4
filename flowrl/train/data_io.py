"""Read a dataset for training or evaluation: a flowrl dataset folder, a `save_to_disk` folder, or JSONL.

A flowrl dataset folder (written by `flowrl build-dataset`) holds a `datasets.DatasetDict` saved with
`save_to_disk`, JSONL copies of its splits and `flowrl_dataset.json` ({method, desirable_weight, ...}).
The DatasetDict is preferred; a folder with only `train.jsonl` (and `validation.jsonl`), at its top or
under `data/`, works too.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError, require
from flowrl.methods import canonical_method, get_method

log = logging.getLogger(__name__)

META_FILE = "flowrl_dataset.json"
EVAL_SPLITS = ("validation", "eval", "test")


@dataclass
class LoadedData:
    train: Any
    eval: Any | None
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def columns(self) -> list[str]:
        return list(self.train.column_names)


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / META_FILE if path.is_dir() else path.parent / META_FILE
    if not meta_path.is_file():
        return {}
    try:
        data = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{meta_path} cannot be read: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _from_jsonl(path: Path) -> Any:
    datasets = require("datasets")
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise ConfigError(f"{path}:{n} is not JSON: {exc}") from exc
    if not rows:
        raise ConfigError(f"{path} holds no rows")
    return datasets.Dataset.from_list(rows)


def load_dataset_dir(path: Path | str) -> LoadedData:
    """The train split and, if there is one, the validation split of a dataset folder or JSONL file."""
    datasets = require("datasets")
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"dataset {p} does not exist: build one with `flowrl build-dataset --out {p}`")
    meta = read_meta(p)
    if p.is_file():
        if p.suffix.lower() not in (".jsonl", ".json"):
            raise ConfigError(f"dataset {p}: pass a dataset folder or a .jsonl file")
        return LoadedData(train=_from_jsonl(p), eval=None, meta=meta, source=str(p))
    if (p / "dataset_dict.json").is_file() or (p / "dataset_info.json").is_file() or (p / "state.json").is_file():
        loaded = datasets.load_from_disk(str(p))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ConfigError(f"dataset {p} has no train split (splits: {', '.join(loaded)})")
            evals = next((loaded[s] for s in EVAL_SPLITS if s in loaded and len(loaded[s])), None)
            return LoadedData(train=loaded["train"], eval=evals, meta=meta, source=str(p))
        return LoadedData(train=loaded, eval=None, meta=meta, source=str(p))
    for folder in (p, p / "data"):
        if (folder / "train.jsonl").is_file():
            evals = next(
                (_from_jsonl(folder / f"{s}.jsonl") for s in EVAL_SPLITS if (folder / f"{s}.jsonl").is_file()), None
            )
            return LoadedData(train=_from_jsonl(folder / "train.jsonl"), eval=evals, meta=meta, source=str(p))
    raise ConfigError(
        f"dataset {p} holds neither a saved DatasetDict nor train.jsonl: build it with `flowrl build-dataset --out {p}`"
    )


def check_for_method(data: LoadedData, method: str) -> None:
    """Refuse a dataset built for another method, or one without the columns TRL needs, with a clear line."""
    built_for = canonical_method(str(data.meta.get("method") or "")) if data.meta.get("method") else ""
    if built_for and built_for != method:
        raise ConfigError(
            f"dataset {data.source} was built for {built_for}, not {method}: "
            f"train with --method {built_for} or build a {method} dataset"
        )
    if len(data.train) == 0:
        raise ConfigError(f"dataset {data.source} has no training rows")
    columns = set(data.columns)
    for options in get_method(method).required_columns:
        if not columns.intersection(options):
            raise ConfigError(
                f"dataset {data.source} lacks the column {' or '.join(options)} that {method} needs "
                f"(it has {', '.join(sorted(columns))})"
            )
