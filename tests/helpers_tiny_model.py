"""A tiny randomly initialised Llama-style causal LM and a chat tokenizer, built without any download.

For tests that must run a real TRL trainer step on CPU in about a second:

    from helpers_tiny_model import tiny_model_and_tokenizer
    model, tokenizer = tiny_model_and_tokenizer()

- The tokenizer is a byte-level BPE (`tokenizers`), trained in memory on a few strings, so any text
  encodes without unknown tokens. Special tokens: `<|pad|>` (pad), `<|im_end|>` (eos, end of turn),
  `<|im_start|>`, `<|endoftext|>`.
- Its chat template (`TINY_CHAT_TEMPLATE`) is ChatML-like and supports `tools` (rendered as JSON in
  the system turn), assistant `tool_calls` (dict or JSON-string arguments) and `tool` messages. It is
  prefix-preserving and wraps assistant output, end-of-turn token included, in `{% generation %}`
  markers, so SFT's `assistant_only_loss=True` and GRPO's tool masking work with it as is.
- The model is a `LlamaForCausalLM` with `hidden_size=32`, 2 layers, 4 heads: about 30k parameters.

`save_tiny_model(path)` writes both to a folder, for code that loads a model by path; `save_lively_tiny_model`
writes one whose greedy replies depend on the prompt and end at different lengths (for generation backends).
Only transformers and tokenizers are needed (no torch import happens at module import time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_CHAT_TEMPLATE = (
    "{%- if tools or messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    "{%- if tools %}{{- '\\n# Tools' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    '{{- \'<tool_call>{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "You are a careful coding agent. Use exec_code to compute, then answer.",
    "What is 12 times 7 plus 3? The answer is 87.",
    '<tool_call>{"name": "exec_code", "arguments": {"code": "print(12 * 7 + 3)"}}</tool_call>',
    "system user assistant tool # Tools function parameters properties type object string",
    "The weather in Berlin is 21C and sunny. Error: Traceback (most recent call last)",
]


def tiny_tokenizer(extra_texts: list[str] | None = None, vocab_size: int = 400) -> Any:
    """A `PreTrainedTokenizerFast` with pad/eos tokens and `TINY_CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS + list(extra_texts or []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=None,
        model_max_length=4096,
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|endoftext|>"]})
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_model(tokenizer: Any, *, hidden_size: int = 32, layers: int = 2, heads: int = 4, seed: int = 0) -> Any:
    """A randomly initialised `LlamaForCausalLM` sized for `tokenizer`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None
    )
    return model


def tiny_model_and_tokenizer(extra_texts: list[str] | None = None, **model_kwargs: Any) -> tuple[Any, Any]:
    tokenizer = tiny_tokenizer(extra_texts)
    return tiny_model(tokenizer, **model_kwargs), tokenizer


def save_tiny_model(path: str | Path, **kwargs: Any) -> Path:
    """Write a tiny model and its tokenizer to `path` (loadable with `from_pretrained(path)`)."""
    path = Path(path)
    model, tokenizer = tiny_model_and_tokenizer(**kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_lively_tiny_model(path: str | Path, prompt: list[dict[str, Any]]) -> Path:
    """The tiny model with livelier weights (std 0.2, from a fixed seed, so greedy replies depend on the prompt
    instead of repeating one token) and an end-of-turn token made to compete with the favourite token after
    `prompt` (its embedding row is that token's plus noise), so replies end at different steps."""
    import torch

    model, tokenizer = tiny_model_and_tokenizer()
    draw = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=draw) * 0.2)
        embeddings = model.get_input_embeddings().weight
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
            "input_ids"
        ]
        favourite = int(model(ids).logits[0].mean(0).argmax())
        embeddings[tokenizer.eos_token_id] = embeddings[favourite] + torch.randn(32, generator=draw) * 0.05
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
