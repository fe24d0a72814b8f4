"""A chat backend on a local transformers model (CPU is fine for SmolLM2-135M)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

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

    def complete(self, messages: list[dict[str, Any]]) -> tuple[str, int, int]:
        torch = require("torch")
        clean = [{"role": m["role"], "content": _content(m)} for m in messages]
        ids = self.tokenizer.apply_chat_template(clean, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with self._lock, torch.no_grad():
            out = self.model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=self.temperature > 0,
                                      temperature=self.temperature or None, top_p=0.95 if self.temperature > 0 else None,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
        n_in = ids["input_ids"].shape[1]
        new = out[0, n_in:]
        return self.tokenizer.decode(new, skip_special_tokens=True).strip(), int(n_in), int(new.shape[0])


def _content(message: dict[str, Any]) -> str:
    """Flatten an OpenAI message (with tool calls or a tool result) into text the chat template takes."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += f'\n<tool_call>{{"name": "{fn.get("name")}", "arguments": {fn.get("arguments") or "{}"}}}</tool_call>'
    if message.get("role") == "tool":
        text = f"[{message.get('name', 'tool')} result] {text}"
    return text.strip()
