"""Tiny datasets in TRL's formats, saved the way `flowrl build-dataset` saves them, for training tests.

The tiny model itself comes from `helpers_tiny_model.save_tiny_model` (a randomly initialised two-layer
Llama and an in-memory byte-level BPE tokenizer with a ChatML-like template; no downloads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers_tiny_model import save_tiny_model


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tiny Llama + tokenizer into `out_dir` and return it."""
    return save_tiny_model(out_dir, seed=seed)


# --------------------------------------------------------------------------- tiny datasets in TRL's formats


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": text}]


PROMPTS = ["Write add in Python.", "What is the capital of France?", "Say hello.", "Search the weather."]
GOOD = ["```python\ndef add(a, b):\n    return a + b\n```", "Paris.", "Hello world!", '{"name": "search"}']
BAD = ["def add(a, b) return", "I cannot do that.", "Error: file not found.", "no"]


def tiny_rows(method: str, n: int = 8) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(n):
        p, g, b = PROMPTS[i % 4], GOOD[i % 4], BAD[i % 4]
        if method == "sft":
            rows.append({"messages": _user(p) + _assistant(g)})
        elif method == "dpo":
            rows.append({"prompt": _user(p), "chosen": _assistant(g), "rejected": _assistant(b)})
        elif method == "kto":
            rows.append({"prompt": _user(p), "completion": _assistant(g if i % 2 == 0 else b), "label": i % 2 == 0})
        elif method == "grpo":
            rows.append({"prompt": _user(p), "reference": g})
        elif method == "grpo-offline":
            rows.append(
                {
                    "prompt": _user(p),
                    "completions": [_assistant(g), _assistant(b), _assistant(g + " Done."), _assistant(b + "?")],
                    "rewards": [1.0, 0.0, 0.8, 0.1],
                }
            )
        else:
            raise ValueError(method)
    return rows


def write_tiny_dataset(out_dir: Path, method: str, n: int = 8) -> Path:
    """A flowrl-style dataset folder: DatasetDict (train + validation) saved to disk, plus flowrl_dataset.json."""
    from datasets import Dataset, DatasetDict

    rows = tiny_rows(method, n)
    DatasetDict({"train": Dataset.from_list(rows), "validation": Dataset.from_list(rows[:2])}).save_to_disk(
        str(out_dir)
    )
    meta: dict[str, Any] = {"method": method, "rows": {"train": n, "validation": 2}}
    if method == "kto":
        meta.update(desirable_weight=1.0, undesirable_weight=1.0)
    (out_dir / "flowrl_dataset.json").write_text(json.dumps(meta), encoding="utf-8")
    return out_dir
