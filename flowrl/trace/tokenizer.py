"""A tokenizer's identity, as traces store it: `name@hash` of its vocabulary.

Captured token ids (`LLMCall.prompt_token_ids`, `token_ids`) are only meaningful with the tokenizer that made
them; a trace records that tokenizer's fingerprint, the engines stamp it on what they generate, and the
dataset builders compare it before they reuse captured ids.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def fingerprint(tokenizer: Any) -> str:
    """`name@hash` of the tokenizer's vocabulary: equal fingerprints mean the same ids for the same text."""
    cached = getattr(tokenizer, "_flowrl_fingerprint", None)
    if cached:
        return cached
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(orjson.dumps(vocab)).hexdigest()[:16]
    name = str(getattr(tokenizer, "name_or_path", "") or "tokenizer").rstrip("/").rsplit("/", 1)[-1]
    value = f"{name}@{digest}"
    try:
        tokenizer._flowrl_fingerprint = value
    except AttributeError:  # pragma: no cover - slotted tokenizers
        pass
    return value


def same_tokenizer(a: str | None, b: str | None) -> bool:
    """Fingerprints agree on the vocabulary hash (names may differ: a copied folder is the same tokenizer)."""
    if not a or not b:
        return False
    return a.rsplit("@", 1)[-1] == b.rsplit("@", 1)[-1]
