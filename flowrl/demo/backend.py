"""A chat backend on a local transformers model (CPU is fine for SmolLM2-135M).

Tokens in, tokens out: a reply the backend sampled earlier is given back to the model as the ids it sampled,
not as its text re-tokenized. The agent keeps only text (it parses tool calls out of the reply and renders
them again), and re-tokenizing that text can give other ids than were sampled (`"}}` as one token or two),
so the model would see a context slightly different from the one it wrote, and a trajectory could not be
trained as one sequence. Where a rendered prompt starts with an earlier call's prompt ids, the turn that
follows them is replaced by that call's sampled ids (vLLM's and Agent Lightning's token-in-token-out).
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Any

from flowrl.demo.agent import Completion
from flowrl.errors import require


class TransformersBackend:
    """Generates replies with a local causal LM; `adapter` may be a PEFT adapter dir on top of it."""

    def __init__(self, model_dir: str | Path, *, adapter: str | Path | None = None, max_new_tokens: int = 96,
                 temperature: float = 0.8, seed: int = 0) -> None:
        torch = require("torch")
        transformers = require("transformers")
        torch.manual_seed(seed)
        self.model_name = str(adapter or model_dir)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        if adapter is not None:
            peft = require("peft")
            model = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        self.model = model.eval()
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self._lock = threading.Lock()  # one generation at a time: the model is not re-entrant
        self._sampled: deque[tuple[list[int], list[int]]] = deque(maxlen=256)  # (prompt ids, sampled ids)
        self._end_ids = {int(self.tokenizer.eos_token_id)} if self.tokenizer.eos_token_id is not None else set()
        from flowrl.data.tokens import fingerprint

        self.fingerprint = fingerprint(self.tokenizer)

    def complete(self, messages: list[dict[str, Any]]) -> Completion:
        """The reply, with the prompt ids the model was given, the ids it sampled (end-of-turn token included)
        and each sampled token's log-probability under softmax(logits / temperature) (temperature 1 when
        greedy): the quantity TRL's GRPO computes for the same tokens, so the two can be compared."""
        torch = require("torch")
        clean = [{"role": m["role"], "content": _content(m)} for m in messages]
        rendered = self.tokenizer.apply_chat_template(clean, add_generation_prompt=True, tokenize=True, return_dict=True)
        prompt = torch.tensor([self.reuse_sampled(list(rendered["input_ids"]))])
        ids = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
        with self._lock, torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=self.temperature > 0,
                                      temperature=self.temperature or None, top_p=0.95 if self.temperature > 0 else None,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                                      return_dict_in_generate=True, output_logits=True)
        n_in = ids["input_ids"].shape[1]
        new = out.sequences[0, n_in:]
        logits = torch.stack(out.logits, dim=1)[0].float() / (self.temperature or 1.0)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        self._sampled.append((ids["input_ids"][0].tolist(), new.tolist()))
        return Completion(
            text=self.tokenizer.decode(new, skip_special_tokens=True).strip(), prompt_tokens=int(n_in),
            completion_tokens=int(new.shape[0]), prompt_token_ids=ids["input_ids"][0].tolist(),
            token_ids=new.tolist(), logprobs=[round(float(v), 6) for v in logprobs], tokenizer=self.fingerprint,
        )


    def reuse_sampled(self, ids: list[int]) -> list[int]:
        """`ids` with every earlier reply the backend sampled in this conversation put back as its sampled ids."""
        for prompt, sampled in sorted(self._sampled, key=lambda pair: len(pair[0])):
            n = len(prompt)
            if len(ids) <= n or ids[:n] != prompt:
                continue
            end = next((i for i in range(n, len(ids)) if ids[i] in self._end_ids), None)
            if end is None:
                continue
            # the template's end-of-turn token stays when the reply was cut off before its own
            tail = ids[end + 1:] if sampled and sampled[-1] in self._end_ids else ids[end:]
            ids = prompt + sampled + tail
        return ids


def _content(message: dict[str, Any]) -> str:
    """Flatten an OpenAI message (with tool calls or a tool result) into text the chat template takes."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += f'\n<tool_call>{{"name": "{fn.get("name")}", "arguments": {fn.get("arguments") or "{}"}}}</tool_call>'
    if message.get("role") == "tool":
        text = f"[{message.get('name', 'tool')} result] {text}"
    return text.strip()
