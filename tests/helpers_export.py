"""Tiny models for the export tests: a random Llama/Qwen2 with a byte-level BPE ChatML tokenizer, and a LoRA adapter.

Dimensions are multiples of 32 where Q8_0/Q4_0 need them (hidden 64, intermediate 128), so every matrix can
be block-quantised; `intermediate_size=80` gives a matrix whose rows are not, for the fall-back test.
Weights are drawn with std 0.1 (not the usual 0.02) so attention is sharp enough that a wrong Q/K layout
changes the logits clearly. Everything is built locally: no download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

_CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog 12345",
    "def add(a, b):\n    return a + b",
    "What is the capital of France? Paris. List the files in /tmp and count them.",
]


def tiny_tokenizer(template: str = CHATML_TEMPLATE, vocab_size: int = 300) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = template
    return fast


def save_tiny_model(
    path: Path,
    *,
    arch: str = "llama",
    intermediate_size: int = 128,
    vocab_size: int = 320,
    attention_bias: bool = False,
    tie: bool = True,
    seed: int = 0,
) -> Path:
    """A random model + tokenizer saved as a Hugging Face folder at `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(attention_bias=attention_bias, **kwargs))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    else:
        raise ValueError(arch)
    with torch.no_grad():  # biases are zero at init: make them count, so their layout is checked too
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):
                param.normal_(0, 0.1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_tiny_adapter(base_dir: Path, out_dir: Path, *, seed: int = 1) -> Path:
    """A LoRA adapter on `base_dir` with non-zero weights (so merging changes the model), as `flowrl train` saves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(out_dir))
    return out_dir
