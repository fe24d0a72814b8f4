"""The tokenizer part of a GGUF file, built from a Hugging Face fast tokenizer.

Two tokenizer families are written, the way llama.cpp's `convert_hf_to_gguf.py` writes them:

* **byte-level BPE** (`tokenizer.ggml.model = "gpt2"`): SmolLM/SmolLM2, Llama 3, Qwen2, GPT-2 and most
  newer models. Tokens are stored in the byte alphabet exactly as `tokenizer.json` spells them, plus the
  merges. The pre-tokenizer name (`tokenizer.ggml.pre`) is read off the tokenizer's own pre-tokenizer
  (llama.cpp picks it from a hash of a test encoding; here the structure is matched instead):
  `smollm` (digits split one by one, then GPT-2's regex), `llama-bpe` (Llama 3's regex), `qwen2`
  (Qwen2's regex), `gpt-2` (plain byte-level regex). Anything else is written as `default` with a
  warning: llama.cpp then splits text with its default regex, which may tokenize some text differently.
* **sentencepiece-style BPE with byte fallback** (`"llama"`): Llama 2, Mistral, TinyLlama, from their
  `tokenizer.json`. Scores are `-id` (the merge order such vocabularies follow), `<0xNN>` tokens are
  BYTE. Written best-effort: only the byte-level family is covered by the test suite.

Anything else (WordPiece, Unigram, a slow-only tokenizer) raises ExportError naming what is supported.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.export.errors import ExportError

log = logging.getLogger(__name__)

# The split regexes in the tokenizer.json of Llama 3 and Qwen2 (byte-identical to theirs).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GGUF token types (gguf.TokenType), spelled out so this module imports nothing heavy at load.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SUPPORTED_TOKENIZERS = (
    "byte-level BPE (SmolLM2, Llama 3, Qwen2, GPT-2) and sentencepiece-style BPE with byte fallback (Llama 2, Mistral)"
)

# End-of-turn tokens of the chat formats flowrl knows; written as `tokenizer.ggml.eot_token_id`.
EOT_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@dataclass
class VocabInfo:
    """What was written, for the export result and for the Modelfile."""

    model: str
    pre: str | None
    size: int
    special_ids: dict[str, int] = field(default_factory=dict)
    chat_template: str | None = None
    warnings: list[str] = field(default_factory=list)


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:
        raise ExportError(
            f"cannot load the tokenizer in {model_dir}: {exc}. The folder needs tokenizer.json "
            "and tokenizer_config.json (flowrl's merge step saves them)"
        ) from exc
    if not getattr(tok, "is_fast", False):
        raise ExportError(
            f"the tokenizer in {model_dir} is not a fast (tokenizer.json) tokenizer; GGUF export supports "
            f"{SUPPORTED_TOKENIZERS}"
        )
    return tok


def _flatten(node: dict | None) -> list[dict]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        items = node.get("pretokenizers") or node.get("normalizers") or node.get("decoders") or []
        return [leaf for item in items for leaf in _flatten(item)]
    return [node]


def _split_pattern(step: dict) -> str | None:
    pattern = step.get("pattern") or {}
    return pattern.get("Regex") if isinstance(pattern, dict) else None


def detect_pre(pre_tokenizer: dict | None) -> str:
    """llama.cpp's `tokenizer.ggml.pre` name for a byte-level tokenizer's pre-tokenizer, or `default`."""
    steps = _flatten(pre_tokenizer)
    kinds = [s.get("type") for s in steps]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if kinds == ["ByteLevel"] and byte_level[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and byte_level[0].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not byte_level[0].get("use_regex", True):
        regex = _split_pattern(steps[0])
        if regex == LLAMA3_SPLIT:
            return "llama-bpe"
        if regex == QWEN2_SPLIT:
            return "qwen2"
    return "default"


def _merges(model: dict) -> list[str]:
    merges = model.get("merges") or []
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def _looks_special(token: str) -> bool:
    return (token.startswith("<|") and token.endswith("|>")) or token in ("<pad>", "<mask>")


def _special_ids(tok: Any, size: int) -> dict[str, int]:
    ids: dict[str, int] = {}
    for kind in ("bos", "eos", "unk", "pad"):
        value = getattr(tok, f"{kind}_token_id", None)
        if isinstance(value, int) and 0 <= value < size:
            ids[kind] = value
    vocab = tok.get_vocab()
    for token in EOT_TOKENS:
        if token in vocab and vocab[token] < size:
            ids["eot"] = vocab[token]
            break
    return ids


def _adds(tok: Any, ids: dict[str, int]) -> tuple[bool, bool]:
    """Whether the tokenizer puts BOS in front / EOS at the end of plain text on its own."""
    try:
        encoded = tok("a", add_special_tokens=True)["input_ids"]
    except Exception:  # pragma: no cover - exotic tokenizers
        return False, False
    add_bos = bool(encoded) and "bos" in ids and encoded[0] == ids["bos"]
    add_eos = bool(encoded) and "eos" in ids and encoded[-1] == ids["eos"] and len(encoded) > 1
    return add_bos, add_eos


def _byte_level_tokens(tok: Any, size: int) -> tuple[list[str], list[int]]:
    """Tokens and types as llama.cpp's `get_vocab_base` writes them."""
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = tok.get_added_vocab()
    decoder = tok.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []
    for i in range(size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        token = reverse[i]
        if token in added:
            info = decoder.get(i)
            if info is not None and not info.normalized:
                token = tok.decode(tok.encode(token, add_special_tokens=False))
            if (info is not None and info.special) or _looks_special(token):
                types.append(CONTROL)
            else:
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(token)
    return tokens, types


def _sentencepiece_tokens(tok: Any, size: int) -> tuple[list[str], list[int], list[float]]:
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = tok.get_added_vocab()
    special = set(tok.all_special_ids)
    tokens, types, scores = [], [], []
    for i in range(size):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            scores.append(-10000.0)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
            tokens.append(token)
            types.append(BYTE)
            scores.append(0.0)
        elif i in special:
            tokens.append(token)
            types.append(CONTROL)
            scores.append(0.0)
        else:
            tokens.append(token)
            types.append(USER_DEFINED if token in added else NORMAL)
            scores.append(-float(i))
    return tokens, types, scores


def add_tokenizer(writer: Any, model_dir: Path, vocab_size: int) -> VocabInfo:
    """Write the tokenizer of `model_dir` into `writer` (a gguf.GGUFWriter) for a model of `vocab_size`."""
    tok = load_tokenizer(model_dir)
    spec = json.loads(tok.backend_tokenizer.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ExportError(
            f"the tokenizer in {model_dir} is a {model.get('type')} tokenizer; GGUF export supports "
            f"{SUPPORTED_TOKENIZERS}"
        )
    if len(tok) > vocab_size:
        raise ExportError(
            f"the tokenizer has {len(tok)} tokens but the model's vocab_size is {vocab_size}: "
            "resize the model's embeddings before exporting"
        )

    byte_level = any(
        s.get("type") == "ByteLevel" for s in _flatten(spec.get("pre_tokenizer")) + _flatten(spec.get("decoder"))
    )
    info = VocabInfo(model="gpt2" if byte_level else "llama", pre=None, size=vocab_size)
    if byte_level:
        info.pre = detect_pre(spec.get("pre_tokenizer"))
        if info.pre == "default":
            info.warnings.append(
                "unrecognised byte-level pre-tokenizer: written as 'default'; llama.cpp may split "
                "some text differently from transformers"
            )
        tokens, types = _byte_level_tokens(tok, vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(info.pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
    elif model.get("byte_fallback"):
        tokens, types, scores = _sentencepiece_tokens(tok, vocab_size)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        prepend = any(s.get("type") == "Prepend" for s in _flatten(spec.get("normalizer"))) or any(
            s.get("type") == "Metaspace" and s.get("prepend_scheme", "always") != "never"
            for s in _flatten(spec.get("pre_tokenizer"))
        )
        writer.add_add_space_prefix(prepend)
    else:
        raise ExportError(
            f"the BPE tokenizer in {model_dir} is neither byte-level nor byte-fallback; GGUF export "
            f"supports {SUPPORTED_TOKENIZERS}"
        )

    merges = _merges(model)
    if merges:
        writer.add_token_merges(merges)
    info.special_ids = _special_ids(tok, vocab_size)
    for kind, token_id in info.special_ids.items():
        getattr(writer, f"add_{kind}_token_id")(token_id)
    add_bos, add_eos = _adds(tok, info.special_ids)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):  # several named templates: keep the default one
        template = template.get("default") or next(iter(template.values()), None)
    if template:
        writer.add_chat_template(template)
        info.chat_template = template
    else:
        info.warnings.append("the tokenizer has no chat_template: the GGUF carries none, and Ollama needs a TEMPLATE")
    return info
