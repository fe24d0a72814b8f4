"""Token sequences with loss masks: what the trainer sees, built from what the model saw.

A row becomes tokens in one of two ways, and says which (`TokenSequence.source`):

1. **captured**: the LLM calls of the run carry the ids the backend gave the model and the ids it sampled
   (`LLMCall.prompt_token_ids`, `token_ids`). They are used exactly. A run's calls are merged into one
   sequence the way Agent Lightning merges them: call k+1 joins call k's sequence only where its prompt ids
   start with everything call k's sequence holds (prompt and completion); otherwise a new sequence starts.
   Sampled ids get loss mask 1, everything else (system prompt, user turns, few-shot turns, tool results) 0.
2. **template**: without captured ids (ingested runs, another tokenizer), the messages are rendered with the
   base model's chat template, one message at a time. That is faithful only when the template renders
   earlier turns the same whatever follows (prefix-preserving, checked on every row), so a template that is
   not (Qwen3, Llama 3.2, GPT-OSS, DeepSeek-R1-distill) is swapped for TRL's `*_training.jinja` of its
   family, and a template with no training version stops the build with one line naming the model and
   the fix. An assistant turn of this run gets mask 1 from after its generation prompt up to and
   including its end-of-turn token; the newline a template puts after it, and every turn before the run's
   user turn (few-shot examples, history), get 0.

Ids are compared by tokenizer fingerprint (`flowrl.trace.tokenizer.fingerprint`): captured ids of another tokenizer are
not used, and the row is rendered with the template instead, counted under "captured ids of another
tokenizer".
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from flowrl.errors import ConfigError
from flowrl.trace.schema import ExecutionTrace, LLMCall
from flowrl.trace.tokenizer import fingerprint

log = logging.getLogger(__name__)

CAPTURED = "captured"
TEMPLATE = "template"


@dataclass(slots=True)
class TokenSequence:
    """One training sequence. `loss_mask[i]` is 1 where the trainer puts loss. `logprobs[i]` is the sampling
    log-probability of token i where the backend recorded it (None elsewhere, and for template rows)."""

    input_ids: list[int]
    loss_mask: list[int]
    source: str
    logprobs: list[float | None] | None = None

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.input_ids)} ids but {len(self.loss_mask)} mask values")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def trained(self) -> int:
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "input_ids": list(self.input_ids),
            "loss_mask": list(self.loss_mask),
            "source": self.source,
        }
        if self.logprobs is not None:
            out["logprobs"] = list(self.logprobs)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenSequence:
        return cls(
            list(data["input_ids"]), list(data["loss_mask"]), str(data.get("source") or CAPTURED), data.get("logprobs")
        )


# ------------------------------------------------------------------------------------------------
# captured ids


@dataclass(slots=True)
class CallTokens:
    """The ids of one LLM call: what it was given, what it sampled, and the sampled tokens' logprobs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    tokenizer: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "logprobs": self.logprobs,
            "tokenizer": self.tokenizer,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallTokens:
        return cls(list(data["prompt_ids"]), list(data["completion_ids"]), data.get("logprobs"), data.get("tokenizer"))


def call_tokens(call: LLMCall) -> CallTokens | None:
    if not call.has_token_ids:
        return None
    logprobs = call.logprobs if call.logprobs is not None and len(call.logprobs) == len(call.token_ids or ()) else None
    return CallTokens(list(call.prompt_token_ids or ()), list(call.token_ids or ()), logprobs, call.tokenizer)


def captured_calls(trace: ExecutionTrace) -> list[CallTokens] | None:
    """Every LLM call's ids, or None when any call of the run lacks usable ids (a partial record cannot stand
    for the run: the missing call's turn would be trained from another source)."""
    if not trace.llm_calls:
        return None
    calls = [call_tokens(c) for c in trace.llm_calls]
    if any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def merge_calls(calls: list[CallTokens]) -> list[TokenSequence]:
    """Agent Lightning's merge: call k+1 extends the current sequence where its prompt starts with it."""
    out: list[TokenSequence] = []
    ids: list[int] = []
    mask: list[int] = []
    logps: list[float | None] = []
    for call in calls:
        if ids and call.prompt_ids[: len(ids)] == ids:
            new = call.prompt_ids[len(ids) :]
        else:
            if ids:
                out.append(TokenSequence(ids, mask, CAPTURED, logps))
            ids, mask, logps = [], [], []
            new = call.prompt_ids
        ids = ids + list(new) + list(call.completion_ids)
        mask = mask + [0] * len(new) + [1] * len(call.completion_ids)
        sampled: list[float | None] = (
            list(call.logprobs) if call.logprobs is not None else [None] * len(call.completion_ids)
        )
        logps = logps + [None] * len(new) + sampled
    if ids:
        out.append(TokenSequence(ids, mask, CAPTURED, logps))
    return out


# ------------------------------------------------------------------------------------------------
# chat-template rendering


class TemplateError(ConfigError):
    """The base model's chat template cannot render this conversation faithfully."""


@dataclass
class RenderStats:
    """What rendering had to do, for the card, the run record and `flowrl dataset show`."""

    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def note(self, key: str, message: str) -> None:
        """Count `key`; log `message` the first time only."""
        if not self.counts[key]:
            log.warning("flowrl: %s", message)
            self.notes.append(message)
        self.counts[key] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "notes": list(self.notes)}


TOOL_CALL_TEXT = "<tool_call>{}</tool_call>"


def fold_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls written into the assistant text (`<tool_call>{"name", "arguments"}</tool_call>`, the SmolLM2
    family's and the example agent's form), for templates that render no `tool_calls` at all."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            out.append(m)
            continue
        parts = [m.get("content") or ""]
        for call in calls:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            args_json = args if isinstance(args, str) else orjson.dumps(args if args is not None else {}).decode()
            parts.append(TOOL_CALL_TEXT.format(f'{{"name": "{fn.get("name", "")}", "arguments": {args_json}}}'))
        out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
    return out


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template (or TRL's training version of it)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        model: str = "",
        template_kwargs: dict[str, Any] | None = None,
        stats: RenderStats | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model = model or str(getattr(tokenizer, "name_or_path", "") or "the base model")
        self.template_kwargs = dict(template_kwargs or {})
        self.stats = stats if stats is not None else RenderStats()
        self.template = self._choose_template()
        self.renders_tool_calls = self._renders_tool_calls()
        self.end_ids = self._end_of_turn_ids()
        self.fingerprint = fingerprint(tokenizer)

    # -- setup ----------------------------------------------------------------------------------
    def _choose_template(self) -> str | None:
        from trl.chat_template_utils import get_training_chat_template

        template = self.tokenizer.chat_template
        if template is None:
            raise TemplateError(f"{self.model} has no chat template: pass a chat model or set tokenizer.chat_template")
        try:
            training = get_training_chat_template(self.tokenizer)
        except ValueError:
            return None  # no training version: every row is checked for prefix preservation as it renders
        except Exception as exc:  # noqa: BLE001 - a template TRL cannot even probe
            raise TemplateError(
                f"the chat template of {self.model} fails on a tool conversation ({exc}): "
                "capture token ids, or pass a model whose template renders tools"
            ) from exc
        if training is not None:
            self.stats.note(
                "template: TRL training template",
                f"the chat template of {self.model} is not prefix-preserving or has no generation marks: "
                "rows are rendered with TRL's training template of its family",
            )
        return training

    def _renders_tool_calls(self) -> bool:
        from trl.chat_template_utils import supports_tool_calling

        if self.template is None:
            return bool(supports_tool_calling(self.tokenizer))
        saved = self.tokenizer.chat_template
        try:
            self.tokenizer.chat_template = self.template
            return bool(supports_tool_calling(self.tokenizer))
        finally:
            self.tokenizer.chat_template = saved

    def _end_of_turn_ids(self) -> set[int]:
        ids = set(getattr(self.tokenizer, "all_special_ids", None) or ())
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    # -- rendering ------------------------------------------------------------------------------
    def ids(self, messages: list[dict[str, Any]], tools: Any = None, generation_prompt: bool = False) -> list[int]:
        kwargs = dict(self.template_kwargs)
        if self.template is not None:
            kwargs["chat_template"] = self.template
        try:
            out = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=generation_prompt,
                tokenize=True,
                return_dict=True,
                **kwargs,
            )
        except Exception as exc:  # noqa: BLE001 - jinja errors, role-order exceptions raised by templates
            raise TemplateError(f"the chat template of {self.model} cannot render this conversation: {exc}") from exc
        ids = out["input_ids"]
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.renders_tool_calls or not any(m.get("tool_calls") for m in messages):
            return messages
        self.stats.note(
            "tool calls written as text",
            f"the chat template of {self.model} drops tool calls: they are written into the assistant "
            'text as <tool_call>{"name": ..., "arguments": ...}</tool_call>',
        )
        return fold_tool_calls(messages)

    def _extend(self, previous: list[int], ids: list[int]) -> list[int]:
        if ids[: len(previous)] != previous:
            raise TemplateError(
                f"the chat template of {self.model} is not prefix-preserving (it renders earlier turns differently "
                "once later turns follow) and TRL ships no training template for it: capture token ids at the "
                "backend (docs/capture.md), or set a prefix-preserving chat template on the base model"
            )
        return ids[len(previous) :]

    def _generated(self, piece: list[int]) -> int:
        """How many leading tokens of an assistant piece the model generated: through its last end-of-turn
        token (a template's trailing newline is not generated)."""
        for k in range(len(piece) - 1, -1, -1):
            if piece[k] in self.end_ids:
                return k + 1
        return len(piece)

    def render(self, messages: list[dict[str, Any]], train_from: int, tools: Any = None) -> TokenSequence:
        """The conversation as one sequence; assistant turns at index >= `train_from` carry loss."""
        messages = self.prepare(messages)
        ids: list[int] = []
        mask: list[int] = []
        for i, message in enumerate(messages):
            if message.get("role") == "assistant" and i >= train_from:
                head = self.ids(messages[:i], tools, generation_prompt=True) if i else []
                new = self._extend(ids, head)
                ids, mask = ids + new, mask + [0] * len(new)
                piece = self._extend(ids, self.ids(messages[: i + 1], tools))
                k = self._generated(piece)
                ids, mask = ids + piece, mask + [1] * k + [0] * (len(piece) - k)
            else:
                new = self._extend(ids, self.ids(messages[: i + 1], tools))
                ids, mask = ids + new, mask + [0] * len(new)
        return TokenSequence(ids, mask, TEMPLATE)

    def prompt_completion(
        self, prompt: list[dict[str, Any]], completion: list[dict[str, Any]], tools: Any = None
    ) -> tuple[list[int], list[int], list[int]]:
        """(prompt ids ending on the generation prompt, completion ids, completion loss mask) for a prompt and the
        messages that follow it (one assistant turn for KTO/DPO; a whole trajectory for GRPO)."""
        seq = self.render(list(prompt) + list(completion), len(prompt), tools)
        head = self.ids(self.prepare(list(prompt)), tools, generation_prompt=True)
        if seq.input_ids[: len(head)] != head:
            head = self.ids(self.prepare(list(prompt)), tools)  # templates whose prompt ends without the header
        n = len(head)
        completion_ids, completion_mask = seq.input_ids[n:], seq.loss_mask[n:]
        while completion_mask and completion_mask[-1] == 0:  # the template's newline after the last turn
            completion_ids, completion_mask = completion_ids[:-1], completion_mask[:-1]
        return seq.input_ids[:n], completion_ids, completion_mask


def aligned_calls(trace: ExecutionTrace, n_steps: int) -> list[CallTokens] | None:
    """The run's captured calls when there is one per assistant turn of the run (call k wrote turn k), else
    None: a run whose calls cannot be matched to its turns is rendered with the template."""
    calls = captured_calls(trace)
    if calls is None or len(calls) != n_steps:
        return None
    return calls


def kept_calls(trace: ExecutionTrace, n_steps: int, kept: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The captured calls (as dicts) of the assistant turns left in `kept`, a trajectory of `n_steps` turns
    trimmed from its end to fit a budget (None: no calls aligned to the turns, `aligned_calls`)."""
    calls = aligned_calls(trace, n_steps)
    if not calls:
        return None
    steps = sum(1 for m in kept if m["role"] == "assistant")
    return [c.to_dict() for c in calls[:steps]]
