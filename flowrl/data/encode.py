"""Dataset rows to token sequences with loss masks, for one base model's tokenizer.

Builders write rows in TRL's own formats (messages, prompt/completion, ...) plus the ids the model really
saw when the run captured them (column `captured`; `logged_tokens` in offline GRPO). Training and
`flowrl dataset show` encode those rows here, so both see the same tokens:

| method | TRL columns | sequences shown |
|---|---|---|
| sft | `input_ids`, `assistant_masks` (one row per sequence) | the run, merged (several when calls do not merge) |
| kto | `prompt_ids`, `completion_ids`, `label` | prompt + the one assistant turn |
| dpo | `prompt_ids`, `chosen_ids`, `rejected_ids` | prompt + chosen, prompt + rejected |
| grpo-offline | (replayed by `flowrl.train.offline_grpo`) | prompt + each logged trajectory |
| grpo | prompts only (TRL generates) | the prompt, nothing trained |

Captured ids are used when their tokenizer fingerprint matches the base model's; otherwise the messages are
rendered with the chat template (`flowrl.data.tokens.ChatRenderer`), and the card counts why. Sequences longer
than `max_length` are dropped, never cut, and counted with the reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowrl.data.tokens import (
    CAPTURED,
    CallTokens,
    ChatRenderer,
    RenderStats,
    TokenSequence,
    merge_calls,
)
from flowrl.methods import get_method
from flowrl.trace.conversation import find_prompt_end
from flowrl.trace.tokenizer import same_tokenizer
from flowrl.trace.transcript import completion_text

OTHER_TOKENIZER = "captured ids of another tokenizer: rendered with the chat template"
NOT_MERGED = "captured calls do not merge into one sequence: rendered with the chat template"
PROMPTS_DIFFER = "chosen and rejected were sampled from different prompt ids: rendered with the chat template"


def row_trace_ids(row: dict[str, Any]) -> list[str]:
    """The traces a dataset row was built from."""
    ids = [row[k] for k in ("trace_id", "chosen_trace_id", "rejected_trace_id") if row.get(k)]
    return ids + list(row.get("trace_ids") or ())


@dataclass
class EncodeStats:
    rows_in: int = 0
    rows_out: int = 0
    sources: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    render: RenderStats = field(default_factory=RenderStats)
    dropped_rows: list[dict[str, Any]] = field(default_factory=list)

    def drop(self, index: int, row: dict[str, Any], reason: str, tokens: int) -> None:
        self.dropped[reason] += 1
        self.dropped_rows.append({"row": index, "trace_ids": row_trace_ids(row), "tokens": tokens, "reason": reason})

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "sequence_sources": dict(self.sources),
            "dropped": dict(self.dropped),
            "dropped_rows": list(self.dropped_rows),
            "rendering": self.render.to_dict(),
        }


def _captured_ok(renderer: ChatRenderer, tokenizer_fp: str | None, stats: EncodeStats) -> bool:
    if same_tokenizer(tokenizer_fp, renderer.fingerprint):
        return True
    stats.render.note(
        "captured ids of another tokenizer", f"{OTHER_TOKENIZER} ({tokenizer_fp} vs {renderer.fingerprint})"
    )
    return False


def _prompt_end(row: dict[str, Any]) -> int:
    if row.get("prompt_end") is not None:
        return int(row["prompt_end"])
    return find_prompt_end(row["messages"])


def _calls(data: Any) -> list[CallTokens]:
    return [CallTokens.from_dict(c) for c in data]


# ------------------------------------------------------------------------------------------------
# per method: a row -> the sequences it stands for


def sft_sequences(row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> list[TokenSequence]:
    captured = row.get("captured")
    if captured and captured.get("calls") and _captured_ok(renderer, captured["calls"][0].get("tokenizer"), stats):
        return merge_calls(_calls(captured["calls"]))
    return [renderer.render(row["messages"], _prompt_end(row), row.get("tools"))]


def _pair(
    prompt_ids: list[int],
    completion_ids: list[int],
    mask: list[int] | None = None,
    source: str = CAPTURED,
    logprobs: Sequence[float | None] | None = None,
) -> TokenSequence:
    mask = mask if mask is not None else [1] * len(completion_ids)
    lp: list[float | None] | None = None
    if logprobs is not None:
        lp = [None] * len(prompt_ids)
        lp.extend(logprobs)
    return TokenSequence(list(prompt_ids) + list(completion_ids), [0] * len(prompt_ids) + list(mask), source, lp)


def kto_parts(row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> tuple[list[int], list[int], str]:
    captured = row.get("captured")
    if captured and captured.get("call") and _captured_ok(renderer, captured["call"].get("tokenizer"), stats):
        call = CallTokens.from_dict(captured["call"])
        return call.prompt_ids, call.completion_ids, CAPTURED
    p, c, _ = renderer.prompt_completion(row["prompt"], row["completion"], row.get("tools"))
    return p, c, "template"


def dpo_parts(
    row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats
) -> tuple[list[int], list[int], list[int], str]:
    captured = row.get("captured")
    if captured and captured.get("chosen") and captured.get("rejected"):
        chosen, rejected = CallTokens.from_dict(captured["chosen"]), CallTokens.from_dict(captured["rejected"])
        if _captured_ok(renderer, chosen.tokenizer, stats):
            if chosen.prompt_ids == rejected.prompt_ids and same_tokenizer(chosen.tokenizer, rejected.tokenizer):
                return chosen.prompt_ids, chosen.completion_ids, rejected.completion_ids, CAPTURED
            stats.render.note("chosen and rejected prompts differ", PROMPTS_DIFFER)
    p, c, _ = renderer.prompt_completion(row["prompt"], row["chosen"], row.get("tools"))
    _, r, _ = renderer.prompt_completion(row["prompt"], row["rejected"], row.get("tools"))
    return p, c, r, "template"


def trajectory_parts(
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    tokens: Any,
    tools: Any,
    renderer: ChatRenderer,
    stats: EncodeStats,
) -> tuple[list[int], list[int], list[int], list[float] | None, str]:
    """(prompt ids, completion ids, completion mask, sampled logprobs or None, source) of one logged trajectory
    (offline GRPO). Captured calls are used when they merge into one sequence."""
    if tokens and _captured_ok(renderer, tokens[0].get("tokenizer"), stats):
        calls = _calls(tokens)
        merged = merge_calls(calls)
        if len(merged) == 1:
            seq, n = merged[0], len(calls[0].prompt_ids)
            logps = seq.logprobs[n:] if seq.logprobs is not None else None
            have = logps is not None and all(v is not None for v, m in zip(logps, seq.loss_mask[n:]) if m)
            return (
                seq.input_ids[:n],
                seq.input_ids[n:],
                seq.loss_mask[n:],
                [0.0 if v is None else float(v) for v in logps] if have and logps is not None else None,
                CAPTURED,
            )
        stats.render.note("captured calls do not merge", NOT_MERGED)
    if not isinstance(prompt, list):  # plain-text rows: the text, then the end-of-turn token
        tok = renderer.tokenizer
        p = tok.encode(str(prompt), add_special_tokens=False)
        c = tok.encode(completion_text(completion), add_special_tokens=False)
        c = c + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
        return p, c, [1] * len(c), None, "text"
    p, c, m = renderer.prompt_completion(prompt, completion, tools)
    return p, c, m, None, "template"


def _sft_sequences(row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> list[TokenSequence]:
    return sft_sequences(row, renderer, stats)


def _kto_sequences(row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> list[TokenSequence]:
    p, c, source = kto_parts(row, renderer, stats)
    return [_pair(p, c, source=source)]


def _dpo_sequences(row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> list[TokenSequence]:
    p, c, r, source = dpo_parts(row, renderer, stats)
    return [_pair(p, c, source=source), _pair(p, r, source=source)]


def _grpo_offline_sequences(row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> list[TokenSequence]:
    tokens = row.get("logged_tokens") or [None] * len(row["logged_completions"])
    out = []
    for completion, toks in zip(row["logged_completions"], tokens):
        p, c, m, logps, source = trajectory_parts(row["prompt"], completion, toks, row.get("tools"), renderer, stats)
        out.append(_pair(p, c, m, source, logps))
    return out


# the encoder of each encoding in flowrl.methods.ENCODINGS: a row -> its sequences
ROW_SEQUENCES = {
    "sft": _sft_sequences,
    "kto": _kto_sequences,
    "dpo": _dpo_sequences,
    "grpo-offline": _grpo_offline_sequences,
}


def row_sequences(method: str, row: dict[str, Any], renderer: ChatRenderer, stats: EncodeStats) -> list[TokenSequence]:
    """Every sequence a row stands for, with its loss mask (what `flowrl dataset show` prints). Chosen by the
    method's `encoding` in the method table, so a registered method that reuses an encoding needs nothing here."""
    spec = get_method(method)
    encoder = ROW_SEQUENCES.get(spec.encoding or "")
    if encoder is not None:
        return encoder(row, renderer, stats)
    if spec.online:  # online GRPO: the prompt the policy completes
        ids = renderer.ids(renderer.prepare(row["prompt"]), row.get("tools"), generation_prompt=True)
        return [TokenSequence(ids, [0] * len(ids), "template")]
    raise ValueError(f"method {method!r}: no encoding {spec.encoding!r} in flowrl.data.encode")


# ------------------------------------------------------------------------------------------------
# whole datasets -> TRL's tokenized columns

_TOO_LONG = "longer than max_length {}"


def _sft_rows(
    index: int, row: dict[str, Any], renderer: ChatRenderer, max_length: int | None, stats: EncodeStats
) -> list[dict[str, Any]]:
    out = []
    for seq in sft_sequences(row, renderer, stats):
        stats.sources[seq.source] += 1
        if max_length is not None and len(seq) > max_length:
            stats.drop(index, row, _TOO_LONG.format(max_length), len(seq))
        elif not seq.trained:
            stats.drop(index, row, "no generated tokens", len(seq))
        else:
            out.append({"input_ids": seq.input_ids, "assistant_masks": seq.loss_mask})
    return out


def _kto_rows(
    index: int, row: dict[str, Any], renderer: ChatRenderer, max_length: int | None, stats: EncodeStats
) -> list[dict[str, Any]]:
    p, c, source = kto_parts(row, renderer, stats)
    stats.sources[source] += 1
    if max_length is not None and len(p) + len(c) > max_length:
        stats.drop(index, row, _TOO_LONG.format(max_length), len(p) + len(c))
        return []
    return [{"prompt_ids": p, "completion_ids": c, "label": bool(row["label"])}]


def _dpo_rows(
    index: int, row: dict[str, Any], renderer: ChatRenderer, max_length: int | None, stats: EncodeStats
) -> list[dict[str, Any]]:
    p, c, r, source = dpo_parts(row, renderer, stats)
    stats.sources[source] += 1
    if max_length is not None and len(p) + max(len(c), len(r)) > max_length:
        stats.drop(index, row, _TOO_LONG.format(max_length), len(p) + max(len(c), len(r)))
        return []
    return [{"prompt_ids": p, "chosen_ids": c, "rejected_ids": r}]


# the encodings whose rows TRL's SFT, KTO and DPO trainers take as token ids: a row -> its TRL rows
TRL_ROWS = {"sft": _sft_rows, "kto": _kto_rows, "dpo": _dpo_rows}


def encode_for_trl(
    method: str,
    rows: list[dict[str, Any]],
    renderer: ChatRenderer,
    *,
    max_length: int | None,
    stats: EncodeStats | None = None,
) -> tuple[list[dict[str, Any]], EncodeStats]:
    """TRL-ready tokenized rows for SFT, KTO or DPO (`method`: the encoding). Over-long sequences are dropped and
    counted."""
    encoder = TRL_ROWS.get(method)
    stats = stats or EncodeStats(render=renderer.stats)
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        stats.rows_in += 1
        if encoder is None:
            raise ValueError(f"encode_for_trl does not take {method!r}")
        out.extend(encoder(index, row, renderer, max_length, stats))
    stats.rows_out = len(out)
    return out, stats


# ------------------------------------------------------------------------------------------------
# the token budget of a build


class TokenBudget:
    """Measures built rows in tokens of the target model (what `flowrl train` will feed it) and says which
    rows exceed `max_length`: `build-dataset --base-model M --max-length N`."""

    def __init__(self, method: str, renderer: ChatRenderer, max_length: int) -> None:
        self.method = method
        self.renderer = renderer
        self.max_length = max_length
        self.stats = EncodeStats(render=renderer.stats)

    def length(self, row: dict[str, Any]) -> int:
        """The longest sequence the row stands for, in tokens (an online GRPO row: its prompt)."""
        return max((len(s) for s in row_sequences(self.method, row, self.renderer, self.stats)), default=0)

    def fits(self, row: dict[str, Any]) -> tuple[bool, int]:
        n = self.length(row)
        return n <= self.max_length, n
