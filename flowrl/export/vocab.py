"""The tokenizer part of a GGUF file, built from a Hugging Face fast tokenizer.

What gguf ships is used as llama.cpp's `convert_hf_to_gguf.py` uses it: `gguf.SpecialVocab` reads the merges,
the special token ids (bos/eos/unk/pad/...), the add_bos/add_eos flags and the chat template from
tokenizer.json, tokenizer_config.json, chat_template.jinja and config.json; `gguf.LlamaHfVocab` lists the tokens
of a sentencepiece-style tokenizer. What gguf does not do is done here:

* **byte-level BPE** (`tokenizer.ggml.model = "gpt2"`): SmolLM/SmolLM2, Llama 3, Qwen2/Qwen3, GPT-2 and most
  newer models. The token list and types are built as the converter's `get_vocab_base` builds them (gguf has no
  helper for it). The pre-tokenizer name (`tokenizer.ggml.pre`) is read off the tokenizer's own pre-tokenizer
  (llama.cpp picks it from a hash of a test encoding; here the structure is matched instead):
  `smollm` (digits split one by one, then GPT-2's regex), `llama-bpe` (Llama 3's regex), `qwen2`
  (Qwen2's regex), `gpt-2` (plain byte-level regex). Anything else is written as `default` with a
  warning: llama.cpp then splits text with its default regex, which may tokenize some text differently.
* **sentencepiece-style BPE with byte fallback** (`"llama"`): Llama 2, Mistral, TinyLlama, Gemma 3, from their
  `tokenizer.json`, through `gguf.LlamaHfVocab`. Its scores are a constant placeholder; llama.cpp's
  sentencepiece tokenizer merges the pair whose result scores highest, so the score written is `-id` instead (BPE
  vocabularies list merged tokens in merge order), which makes llama.cpp merge as the BPE merges do.
  `add_space_prefix` follows the tokenizer's own Prepend/Metaspace step (Gemma 3 has none).
* the end-of-turn token of the chat formats flowrl knows (`tokenizer.ggml.eot_token_id`), and add_bos/add_eos
  taken from what the tokenizer actually does when tokenizer_config.json does not state them (llama.cpp would
  otherwise assume add_bos for every sentencepiece-style vocabulary).

Anything else (WordPiece, Unigram, a slow-only tokenizer) raises ExportError naming what is supported.
"""

from __future__ import annotations

import json
import logging
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
    "byte-level BPE (SmolLM2, Llama 3, Qwen2/3, GPT-2) and sentencepiece-style BPE with byte fallback "
    "(Llama 2, Mistral, Gemma 3)"
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


def _looks_special(token: str) -> bool:
    """The converter's `does_token_look_special`: added tokens some models fail to mark special."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


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
                token = token.replace("\u2581", " ")  # as the converter: user-defined spaces pre-normalised
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(token)
    return tokens, types


def _llama_hf_tokens(model_dir: Path, tok: Any, size: int) -> tuple[list[str], list[int], list[float]]:
    """Tokens and types from `gguf.LlamaHfVocab`, scored `-id`, padded with unused tokens up to `size`."""
    import gguf

    try:
        vocab = gguf.LlamaHfVocab(model_dir)
    except (FileNotFoundError, TypeError) as exc:
        raise ExportError(f"gguf cannot read the byte-fallback tokenizer in {model_dir}: {exc}") from exc
    tokens: list[str] = []
    types: list[int] = []
    scores: list[float] = []
    for text, _score, token_type in vocab.all_tokens():
        token = text.decode("utf-8")
        token_id = len(tokens)
        if tok.convert_tokens_to_ids(token) != token_id:  # LlamaHfVocab lists added tokens after the base ones
            raise ExportError(
                f"token {token!r} of the tokenizer in {model_dir} has id {tok.convert_tokens_to_ids(token)}, "
                f"not {token_id}: added tokens with gaps in their ids cannot be written as a GGUF vocabulary"
            )
        tokens.append(token)
        types.append(int(token_type))
        scores.append(0.0 if token_type in (gguf.TokenType.BYTE, gguf.TokenType.CONTROL) else -float(token_id))
    for i in range(len(tokens), size):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
        scores.append(-10000.0)
    return tokens, types, scores


def _add_space_prefix(spec: dict[str, Any]) -> bool:
    """Whether the tokenizer puts a space (as `▁`) in front of the text, as Llama 2's does and Gemma's does not."""
    return any(s.get("type") == "Prepend" for s in _flatten(spec.get("normalizer"))) or any(
        s.get("type") == "Metaspace" and s.get("prepend_scheme", "always") != "never"
        for s in _flatten(spec.get("pre_tokenizer"))
    )


def special_vocab(tok: Any, model_dir: Path, vocab_size: int) -> Any:
    """`gguf.SpecialVocab` of `model_dir`, completed with what it cannot read from the files.

    The EOT id of a known chat format is added when SpecialVocab found none, add_bos/add_eos are taken from the
    tokenizer's behaviour when tokenizer_config.json does not state them, and the chat template from the loaded
    tokenizer when no file carried one.
    """
    import gguf

    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=vocab_size)
    if "eot" not in special.special_token_ids:
        vocab = tok.get_vocab()
        for token in EOT_TOKENS:
            if token in vocab and vocab[token] < vocab_size:
                special.special_token_ids["eot"] = vocab[token]
                break
    add_bos, add_eos = _adds(tok, special.special_token_ids)
    special.add_special_token.setdefault("bos", add_bos)
    special.add_special_token.setdefault("eos", add_eos)
    if special.chat_template is None:
        template = getattr(tok, "chat_template", None)
        special.chat_template = template or None
    return special


def _default_template(template: Any) -> str | None:
    """The default template of SpecialVocab's chat_template (a string, or a list of named templates)."""
    if isinstance(template, dict):
        return template.get("default") or next(iter(template.values()), None)
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return template or None


def add_tokenizer(writer: Any, model_dir: Path, vocab_size: int) -> VocabInfo:
    """Write the tokenizer of `model_dir` into `writer` (a gguf.GGUFWriter) for a model of `vocab_size`."""
    model_dir = Path(model_dir)
    tok = load_tokenizer(model_dir)
    if not (model_dir / "tokenizer.json").is_file():
        raise ExportError(f"no tokenizer.json in {model_dir}: GGUF export reads the tokenizer from it")
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
        tokens, types, scores = _llama_hf_tokens(model_dir, tok, vocab_size)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_add_space_prefix(_add_space_prefix(spec))
    else:
        raise ExportError(
            f"the BPE tokenizer in {model_dir} is neither byte-level nor byte-fallback; GGUF export "
            f"supports {SUPPORTED_TOKENIZERS}"
        )

    special = special_vocab(tok, model_dir, vocab_size)
    special.add_to_gguf(writer, quiet=True)
    info.special_ids = dict(special.special_token_ids)
    info.chat_template = _default_template(special.chat_template)
    if not info.chat_template:
        info.warnings.append("the tokenizer has no chat_template: the GGUF carries none, and Ollama needs a TEMPLATE")
    return info
