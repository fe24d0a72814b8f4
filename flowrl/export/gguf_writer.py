"""Hugging Face Llama-family checkpoint -> one GGUF file, with the PyPI `gguf` package (no llama.cpp build).

What is written, following llama.cpp's `convert_hf_to_gguf.py` for these architectures:

* tensors renamed with `gguf.get_tensor_name_map` (`model.layers.0.self_attn.q_proj.weight` ->
  `blk.0.attn_q.weight`); for the `llama` architecture the Q and K projections (and their biases) are
  permuted from Hugging Face's rotate-half layout to llama.cpp's interleaved one, exactly as the converter
  does; `lm_head.weight` is left out when the embeddings are tied (llama.cpp then reuses `token_embd`);
* hyper-parameters (context, embedding and feed-forward length, heads, KV heads, RoPE base and dims,
  RMS-norm epsilon, vocab size), `general.name` and `general.file_type`;
* the tokenizer, merges, special token ids and chat template (see `flowrl.export.vocab`);
* tensor types per `flowrl.export.quantize`.

The file is streamed: tensor infos first, then one tensor at a time is read, converted and written, so
memory stays at about one tensor. It is written under a temporary name in the target folder and renamed
into place only when complete: a full disk or any other failure leaves no partial file behind.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.export.errors import ExportError, UnsupportedArchitectureError
from flowrl.export.quantize import TensorPlan, check_quant, encode, file_type, plan_tensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchSpec:
    gguf_arch: str  # name in gguf.MODEL_ARCH_NAMES
    permute_qk: bool


# Hugging Face `architectures[0]` -> how llama.cpp converts it. Mistral is converted as `llama`, as llama.cpp does.
ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec("llama", permute_qk=True),
    "MistralForCausalLM": ArchSpec("llama", permute_qk=True),
    "Qwen2ForCausalLM": ArchSpec("qwen2", permute_qk=False),
}

_SKIP_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class GGUFResult:
    path: Path
    quant: str
    architecture: str
    n_tensors: int
    size_bytes: int
    tensor_types: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ExportError(
            f"no config.json in {model_dir}: GGUF export needs a merged Hugging Face model folder "
            "(run `flowrl export --format safetensors` first, or pass the adapter folder to `flowrl export`)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from exc


def arch_spec(config: dict[str, Any]) -> tuple[str, ArchSpec]:
    names = config.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
    shown = ", ".join(names) or f"model_type {config.get('model_type')!r}"
    raise UnsupportedArchitectureError(
        f"GGUF export does not support {shown}: supported architectures are {', '.join(ARCHITECTURES)}. "
        "Use `--format safetensors` for other models (Ollama can import some safetensors folders directly)"
    )


def _rope_theta(config: dict[str, Any]) -> float | None:
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta"))
    return float(theta) if theta is not None else None


def _rope_scaling(config: dict[str, Any]) -> dict[str, Any] | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    return None if kind in (None, "default") else dict(scaling, rope_type=kind)


def _permute(weights: Any, n_head: int) -> Any:
    """llama.cpp's `LlamaModel.permute`: rotate-half (HF) -> interleaved pairs (GGML) along the rows."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _weight_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        files = sorted(model_dir.glob("pytorch_model*.bin"))
    if not files:
        raise ExportError(f"no weights (*.safetensors or pytorch_model*.bin) in {model_dir}")
    return files


def _tensor_index(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """name -> (file, shape), without loading the data."""
    index: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for path in files:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    index[key] = (path, tuple(f.get_slice(key).get_shape()))
        else:
            for key, value in _torch_state_dict(path).items():
                index[key] = (path, tuple(value.shape))
    return index


@functools.lru_cache(maxsize=1)
def _torch_state_dict(path: Path) -> dict[str, Any]:
    """A pytorch_model*.bin shard, loaded once while its tensors are written (tensors come shard by shard)."""
    import torch

    return torch.load(str(path), map_location="cpu", weights_only=True)


def _load(path: Path, key: str) -> Any:
    """One tensor as float32 numpy."""
    import torch

    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            tensor = f.get_tensor(key)
    else:
        tensor = _torch_state_dict(path)[key]
    return tensor.to(torch.float32).numpy()


def _nbytes(shape: tuple[int, ...], ggml_type: str) -> int:
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n = 1
    for d in shape:
        n *= d
    return n // block * type_size


class GGUFExporter:
    """Write a merged Hugging Face model folder as a GGUF file.

    `GGUFExporter(quant="q8_0").export("merged/", "out/model-q8_0.gguf")` returns a GGUFResult.
    `quant` is one of f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0 (see `flowrl.export.quantize` for which tensor
    gets which type).
    """

    def __init__(self, quant: str = "f16", *, name: str | None = None) -> None:
        self.quant = check_quant(quant)
        self.name = name

    def export(self, model_dir: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> GGUFResult:
        import gguf

        model_dir, out_path = Path(model_dir), Path(out_path)
        config = read_config(model_dir)
        hf_arch, spec = arch_spec(config)
        n_layers = int(config["num_hidden_layers"])
        n_head = int(config["num_attention_heads"])
        n_head_kv = int(config.get("num_key_value_heads") or n_head)
        tied = bool(config.get("tie_word_embeddings", False))
        arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.gguf_arch)
        name_map = gguf.get_tensor_name_map(arch_enum, n_layers)

        index = _tensor_index(_weight_files(model_dir))
        plans: list[tuple[str, str, TensorPlan, tuple[int, ...]]] = []  # (hf name, gguf name, plan, shape)
        for key, (_, shape) in index.items():
            if key.endswith(_SKIP_SUFFIXES) or (tied and key == "lm_head.weight"):
                continue
            gguf_name = name_map.get_name(key, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise UnsupportedArchitectureError(
                    f"tensor {key!r} of {hf_arch} has no GGUF name for architecture {spec.gguf_arch!r}: "
                    f"this checkpoint is not a plain {hf_arch} (supported: {', '.join(ARCHITECTURES)})"
                )
            plans.append((key, gguf_name, plan_tensor(gguf_name, shape, self.quant), shape))

        def transform(key: str, array: Any) -> Any:
            if spec.permute_qk and key.endswith(("q_proj.weight", "q_proj.bias")):
                return _permute(array, n_head)
            if spec.permute_qk and key.endswith(("k_proj.weight", "k_proj.bias")):
                return _permute(array, n_head_kv)
            return array

        result = GGUFResult(path=out_path, quant=self.quant, architecture=hf_arch, n_tensors=len(plans), size_bytes=0)
        scaling = _rope_scaling(config)
        if scaling is not None:
            result.warnings.append(
                f"RoPE scaling {scaling['rope_type']!r} is not written: llama.cpp and transformers' GGUF loader "
                "then use unscaled RoPE, which matches the original only within the unscaled context length"
            )

        def fill(writer: Any) -> None:
            self._add_metadata(writer, config, model_dir)
            from flowrl.export.vocab import add_tokenizer

            vocab = add_tokenizer(writer, model_dir, int(config["vocab_size"]))
            result.warnings.extend(vocab.warnings)

        def tensors() -> Iterator[tuple[str, Any, TensorPlan]]:
            for key, gguf_name, plan, _ in plans:
                yield gguf_name, transform(key, _load(index[key][0], key)), plan

        infos = [(gguf_name, shape, plan) for _, gguf_name, plan, shape in plans]
        try:
            result.size_bytes = write_gguf(out_path, spec.gguf_arch, fill, infos, tensors)
        finally:
            _torch_state_dict.cache_clear()
        for _, gguf_name, plan, _ in plans:
            result.tensor_types[gguf_name] = plan.ggml_type
            if plan.fallback:
                result.fallbacks[gguf_name] = plan.fallback
        for warning in result.warnings:
            log.warning("%s: %s", out_path.name, warning)
        return result

    def _add_metadata(self, writer: Any, config: dict[str, Any], model_dir: Path) -> None:
        import gguf

        n_head = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        head_dim = int(config.get("head_dim") or hidden // n_head)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(self.name or Path(str(config.get("_name_or_path") or model_dir)).name)
        writer.add_context_length(int(config.get("max_position_embeddings") or 2048))
        writer.add_embedding_length(hidden)
        writer.add_block_count(int(config["num_hidden_layers"]))
        writer.add_feed_forward_length(int(config["intermediate_size"]))
        writer.add_head_count(n_head)
        writer.add_head_count_kv(int(config.get("num_key_value_heads") or n_head))
        writer.add_rope_dimension_count(head_dim)
        if head_dim != hidden // n_head:
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        theta = _rope_theta(config)
        if theta is not None:
            writer.add_rope_freq_base(theta)
        writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
        writer.add_vocab_size(int(config["vocab_size"]))
        writer.add_file_type(file_type(self.quant))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_gguf(
    out_path: Path,
    arch: str,
    fill_metadata: Callable[[Any], None],
    infos: list[tuple[str, tuple[int, ...], TensorPlan]],
    tensors: Callable[[], Iterator[tuple[str, Any, TensorPlan]]],
) -> int:
    """Stream a GGUF file to `out_path` atomically; return its size in bytes.

    `infos` lists every tensor (GGUF name, numpy shape, plan) in the order `tensors()` yields them.
    """
    import gguf
    import numpy as np

    out_path.parent.mkdir(parents=True, exist_ok=True)
    expected = sum(_nbytes(shape, plan.ggml_type) for _, shape, plan in infos)
    free = shutil.disk_usage(out_path.parent).free
    if free < expected:
        raise ExportError(
            f"not enough disk space for {out_path}: it needs about {expected / 1e9:.2f} GB, "
            f"{free / 1e9:.2f} GB are free. Free some space or pass another --out"
        )
    tmp = out_path.with_name(f".{out_path.name}.partial-{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        fill_metadata(writer)
        for name, shape, plan in infos:
            raw = None if plan.ggml_type in ("F32", "F16") else getattr(gguf.GGMLQuantizationType, plan.ggml_type)
            dtype = np.float16 if plan.ggml_type == "F16" else np.float32
            writer.add_tensor_info(name, shape, np.dtype(dtype), _nbytes(shape, plan.ggml_type), raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _name, array, plan in tensors():
            data, _ = encode(array, plan.ggml_type)
            writer.write_tensor_data(data)
        writer.flush()
        assert writer.fout is not None
        for f in writer.fout:
            os.fsync(f.fileno())
        writer.close()
        os.replace(tmp, out_path)
    except BaseException as exc:
        writer.close()
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise ExportError(
                f"disk full while writing {out_path} (about {expected / 1e9:.2f} GB needed); "
                "nothing was left behind. Free some space or pass another --out, then run again"
            ) from exc
        if isinstance(exc, OSError):
            raise ExportError(f"cannot write {out_path}: {exc}; nothing was left behind") from exc
        raise
    return out_path.stat().st_size
