"""Per-architecture knowledge for the GGUF writer: which llama.cpp architecture a Hugging Face model becomes, the
tensor transforms it needs and the metadata only it has.

Everything here follows llama.cpp's `convert_hf_to_gguf.py` for the same model class, so that llama.cpp (and Ollama,
which embeds it) computes what the Hugging Face model computes:

* `llama` (Llama, Mistral): Q/K rows permuted from Hugging Face's rotate-half RoPE layout to llama.cpp's interleaved
  one (`LlamaModel.permute`).
* `qwen2`, `qwen3`: no permutation (llama.cpp runs these with NEOX-style RoPE); Qwen3's per-head `q_norm`/`k_norm`
  map to `attn_q_norm`/`attn_k_norm` through gguf's tensor map, and its `head_dim` is written as key/value length.
* `gemma3` (Gemma 3 text models): every `*norm.weight` gets +1 (Gemma3RMSNorm computes `x * (1 + w)`, llama.cpp
  `x * w`); `attention.sliding_window`, `rope.freq_base_swa` and `final_logit_softcapping` are written. llama.cpp
  scales the embeddings by sqrt(hidden) itself, ties the output to `token_embd`, and hard-codes some Gemma 3 choices
  (every 6th layer global, 1/sqrt(head_dim) attention scale, 27B excepted, local RoPE base 10000 in releases that
  ignore `rope.freq_base_swa`): a checkpoint that departs from them is exported with a warning saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowrl.export.errors import UnsupportedArchitectureError

# (writer, config) -> warnings. Writes the keys only this architecture has; never a key the shared writer writes.
MetadataHook = Callable[[Any, dict[str, Any]], list[str]]


@dataclass(frozen=True)
class ArchSpec:
    """How one Hugging Face architecture is converted."""

    gguf_arch: str  # name in gguf.MODEL_ARCH_NAMES
    permute_qk: bool
    norm_shift: float = 0.0  # added to every `*norm.weight` tensor
    extra_metadata: MetadataHook | None = None


def rope_params(config: dict[str, Any], kind: str = "full_attention") -> dict[str, Any]:
    """RoPE parameters of one attention kind: transformers 5 nests them per layer type for Gemma 3."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    nested = params.get(kind)
    return dict(nested) if isinstance(nested, dict) else dict(params)


def rope_theta(config: dict[str, Any]) -> float | None:
    theta = rope_params(config).get("rope_theta", config.get("rope_theta"))
    return float(theta) if theta is not None else None


def rope_scaling(config: dict[str, Any]) -> dict[str, Any] | None:
    """The full-attention RoPE scaling, or None when RoPE is unscaled."""
    params = rope_params(config)
    kind = params.get("rope_type", params.get("type"))
    return None if kind in (None, "default") else dict(params, rope_type=kind)


# Gemma 3 choices llama.cpp's `llama_load_hparams_gemma3` hard-codes rather than reads from the file.
GEMMA3_SWA_PATTERN = 6  # layers 5, 11, 17, ... use global attention, all others the sliding window
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62  # llama.cpp scales attention by 1/sqrt(hidden / heads) for this size only


def _gemma3_metadata(writer: Any, config: dict[str, Any]) -> list[str]:
    """`Gemma3Model.set_gguf_parameters`'s own keys, and a warning for each choice llama.cpp cannot follow."""
    if config.get("attn_logit_softcapping") is not None:
        raise UnsupportedArchitectureError(
            "this Gemma 3 checkpoint sets attn_logit_softcapping, which Gemma 3 removed and llama.cpp's gemma3 "
            "architecture does not implement"
        )
    warnings: list[str] = []
    n_layers = int(config["num_hidden_layers"])
    n_head = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or 256)

    layer_types = config.get("layer_types")
    expected = ["full_attention" if (i + 1) % GEMMA3_SWA_PATTERN == 0 else "sliding_attention" for i in range(n_layers)]
    if config.get("sliding_window_pattern") != 1 and config.get("sliding_window"):
        writer.add_sliding_window(int(config["sliding_window"]))
        if layer_types is not None and list(layer_types) != expected:
            warnings.append(
                "this Gemma 3 checkpoint's global/sliding layer layout differs from every 6th layer global, which "
                "llama.cpp assumes: llama.cpp will attend differently from transformers"
            )
    local = rope_params(config, "sliding_attention").get("rope_theta", config.get("rope_local_base_freq"))
    if local is not None:
        writer.add_rope_freq_base_swa(float(local))
        if float(local) != GEMMA3_LOCAL_ROPE_BASE:
            warnings.append(
                f"local RoPE base {local} written as rope.freq_base_swa; llama.cpp releases that ignore it use "
                f"{GEMMA3_LOCAL_ROPE_BASE:g} for the sliding-window layers"
            )
    if softcap := config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(float(softcap))
    scalar = config.get("query_pre_attn_scalar")
    llama_cpp_scalar = hidden // n_head if n_layers == GEMMA3_27B_LAYERS else head_dim
    if scalar is not None and float(scalar) != float(llama_cpp_scalar):
        warnings.append(
            f"query_pre_attn_scalar is {scalar}, but llama.cpp scales Gemma 3 attention by 1/sqrt({llama_cpp_scalar}) "
            "and reads no key for it: llama.cpp's logits will differ from transformers'"
        )
    return warnings


# Hugging Face `architectures[0]` -> how llama.cpp converts it. Mistral is converted as `llama`, as llama.cpp does.
ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec("llama", permute_qk=True),
    "MistralForCausalLM": ArchSpec("llama", permute_qk=True),
    "Qwen2ForCausalLM": ArchSpec("qwen2", permute_qk=False),
    "Qwen3ForCausalLM": ArchSpec("qwen3", permute_qk=False),
    "Gemma3ForCausalLM": ArchSpec("gemma3", permute_qk=False, norm_shift=1.0, extra_metadata=_gemma3_metadata),
}


def arch_spec(config: dict[str, Any]) -> tuple[str, ArchSpec]:
    """The supported Hugging Face architecture named in `config` and its spec, or UnsupportedArchitectureError."""
    names = config.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
    shown = ", ".join(names) or f"model_type {config.get('model_type')!r}"
    raise UnsupportedArchitectureError(
        f"GGUF export does not support {shown}: supported architectures are {', '.join(ARCHITECTURES)}. "
        "Use `--format safetensors` for other models (Ollama can import some safetensors folders directly)"
    )


def permute_qk(weights: Any, n_head: int) -> Any:
    """llama.cpp's `LlamaModel.permute`: rotate-half (HF) -> interleaved pairs (GGML) along the rows."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def tensor_transform(spec: ArchSpec, config: dict[str, Any]) -> Callable[[str, Any], Any]:
    """`(hf name, float32 array) -> array` as llama.cpp's converter modifies this architecture's tensors."""
    n_head = int(config["num_attention_heads"])
    n_head_kv = int(config.get("num_key_value_heads") or n_head)

    def transform(key: str, array: Any) -> Any:
        if spec.permute_qk and key.endswith(("q_proj.weight", "q_proj.bias")):
            return permute_qk(array, n_head)
        if spec.permute_qk and key.endswith(("k_proj.weight", "k_proj.bias")):
            return permute_qk(array, n_head_kv)
        if spec.norm_shift and key.endswith("norm.weight"):
            return array + spec.norm_shift
        return array

    return transform
