"""Hugging Face decoder checkpoint -> one GGUF file, with the PyPI `gguf` package (no llama.cpp build).

What is written, following llama.cpp's `convert_hf_to_gguf.py` for the architectures in `flowrl.export.gguf_arch`
(Llama, Mistral, Qwen2, Qwen3, Gemma 3 text):

* tensors renamed with `gguf.get_tensor_name_map` (`model.layers.0.self_attn.q_proj.weight` ->
  `blk.0.attn_q.weight`) and transformed as the architecture needs (Llama's Q/K permutation, Gemma's +1 on
  norms: see `gguf_arch`); `lm_head.weight` is left out when the embeddings are tied (llama.cpp then reuses
  `token_embd`);
* hyper-parameters (context, embedding and feed-forward length, heads, KV heads, head dim, RoPE base, dims
  and linear scaling, RMS-norm epsilon, vocab size), `general.name` and `general.file_type`, plus the
  architecture's own keys (Gemma 3's sliding window, local RoPE base, logit softcapping);
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
from flowrl.export.gguf_arch import (  # ArchSpec, ARCHITECTURES, arch_spec: re-exported, callers import them from here
    ARCHITECTURES,
    ArchSpec,
    arch_spec,
    rope_scaling,
    rope_theta,
    tensor_transform,
)
from flowrl.export.quantize import TensorPlan, check_quant, encode, file_type, plan_tensor
from flowrl.export.vocab import add_tokenizer

log = logging.getLogger(__name__)

__all__ = ["ARCHITECTURES", "ArchSpec", "GGUFExporter", "GGUFResult", "arch_spec", "read_config", "write_gguf"]


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


def _linear_scaling(scaling: dict[str, Any]) -> bool:
    """Linear RoPE scaling (Gemma 3 4B and up use it on their global layers) is the one kind written, as llama.cpp's
    converter writes it; the others need per-model tensors or keys this writer does not produce."""
    return scaling["rope_type"] == "linear" and scaling.get("factor") is not None


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

        transform = tensor_transform(spec, config)
        result = GGUFResult(path=out_path, quant=self.quant, architecture=hf_arch, n_tensors=len(plans), size_bytes=0)
        scaling = rope_scaling(config)
        if scaling is not None and not _linear_scaling(scaling):
            result.warnings.append(
                f"RoPE scaling {scaling['rope_type']!r} is not written: llama.cpp and transformers' GGUF loader "
                "then use unscaled RoPE, which matches the original only within the unscaled context length"
            )
        elif scaling is not None:
            result.warnings.append(
                f"linear RoPE scaling (factor {scaling['factor']}) is written for llama.cpp; transformers' GGUF "
                "loader ignores it, so a transformers reload of this file uses unscaled RoPE"
            )

        def fill(writer: Any) -> None:
            self._add_metadata(writer, config, model_dir)
            if spec.extra_metadata is not None:
                result.warnings.extend(spec.extra_metadata(writer, config))
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
        if config.get("head_dim") or head_dim != hidden // n_head:  # as convert_hf_to_gguf: whenever it is given
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        theta = rope_theta(config)
        if theta is not None:
            writer.add_rope_freq_base(theta)
        scaling = rope_scaling(config)
        if scaling is not None and _linear_scaling(scaling):
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(scaling["factor"]))
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
