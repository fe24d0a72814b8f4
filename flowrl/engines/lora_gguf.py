"""A PEFT LoRA adapter folder -> a GGUF LoRA adapter llama.cpp loads beside its base model (`--lora`).

What is written follows llama.cpp's `convert_lora_to_gguf.py`: `general.type = adapter`, `adapter.type = lora`,
`adapter.lora.alpha`, and for each adapted linear layer its `A` (r x in) and `B` (out x r) matrices as
`<gguf tensor name>.lora_a` / `.lora_b` in F32, named and transformed as the base model's GGUF is
(`flowrl.export.gguf_writer`: Llama's Q/K row permutation applies to `B`, whose rows are the layer's outputs).
llama.cpp scales an adapter by alpha / r; a PEFT adapter trained with rsLoRA (alpha / sqrt(r)) is written with
alpha * sqrt(r) so the product is the same.

Refused with one line: adapters of other kinds than LoRA, DoRA, adapters that train whole modules
(`modules_to_save`) or embeddings, and layers the base architecture's GGUF has no name for.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from flowrl.errors import ConfigError
from flowrl.export.gguf_arch import tensor_transform
from flowrl.export.gguf_writer import arch_spec, read_config, write_gguf
from flowrl.export.quantize import TensorPlan

_PREFIXES = ("base_model.model.",)


def _adapter_config(adapter: Path) -> dict[str, Any]:
    try:
        config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{adapter}/adapter_config.json cannot be read ({exc}): pass a PEFT LoRA folder") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{adapter}: a {config.get('peft_type')} adapter; llama.cpp takes LoRA adapters only")
    if config.get("use_dora"):
        raise ConfigError(f"{adapter}: a DoRA adapter, which llama.cpp cannot apply: train without use_dora")
    if config.get("modules_to_save"):
        raise ConfigError(
            f"{adapter} also trains whole modules ({config['modules_to_save']}), which a GGUF LoRA cannot hold: "
            "merge it and serve the merged model instead"
        )
    return dict(config)


def _pairs(adapter: Path) -> dict[str, dict[str, Any]]:
    """hf weight name (`model.layers.0.self_attn.q_proj.weight`) -> {"A": array, "B": array}"""
    from safetensors.numpy import load_file

    path = adapter / "adapter_model.safetensors"
    if not path.is_file():
        raise ConfigError(f"{adapter} has no adapter_model.safetensors: pass a PEFT LoRA folder `flowrl train` wrote")
    pairs: dict[str, dict[str, Any]] = {}
    for key, array in load_file(str(path)).items():
        name = next((key[len(p) :] for p in _PREFIXES if key.startswith(p)), key)
        for part in ("A", "B"):
            marker = f".lora_{part}.weight"
            if name.endswith(marker):
                pairs.setdefault(name[: -len(marker)] + ".weight", {})[part] = array
                break
        else:
            raise ConfigError(f"{adapter}: tensor {key!r} is not a LoRA A or B matrix, which a GGUF LoRA cannot hold")
    broken = [k for k, v in pairs.items() if set(v) != {"A", "B"}]
    if broken:
        raise ConfigError(f"{adapter}: {broken[0]} has only one of its LoRA matrices: the adapter file is damaged")
    return pairs


def write_lora_gguf(adapter: str | Path, base_model: str | Path, out: str | Path) -> Path:
    """Write `adapter` (a PEFT LoRA folder on `base_model`, a Hugging Face model folder) as a GGUF adapter at
    `out`, atomically; returns `out`."""
    import gguf
    import numpy as np

    adapter, base_model, out = Path(adapter), Path(base_model), Path(out)
    config = _adapter_config(adapter)
    base = read_config(base_model)
    _, spec = arch_spec(base)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.gguf_arch)
    name_map = gguf.get_tensor_name_map(arch_enum, int(base["num_hidden_layers"]))
    transform = tensor_transform(spec, base)
    pairs = _pairs(adapter)
    if not pairs:
        raise ConfigError(f"{adapter} holds no LoRA matrices")
    rank = int(config.get("r") or next(iter(pairs.values()))["A"].shape[0])
    alpha = float(config.get("lora_alpha") or rank)
    if config.get("use_rslora"):
        alpha *= math.sqrt(rank)

    tensors: list[tuple[str, Any]] = []
    for key in sorted(pairs):
        if key.endswith(("embed_tokens.weight", "lm_head.weight")):
            raise ConfigError(f"{adapter} adapts {key}: llama.cpp LoRA adapters cannot change the embeddings")
        gguf_name = name_map.get_name(key, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ConfigError(
                f"{adapter}: {key} has no GGUF name for {spec.gguf_arch}: this adapter is not on this base"
            )
        a = np.ascontiguousarray(pairs[key]["A"], dtype=np.float32)
        b = np.ascontiguousarray(transform(key, np.asarray(pairs[key]["B"], dtype=np.float32)), dtype=np.float32)
        tensors += [(gguf_name + ".lora_a", a), (gguf_name + ".lora_b", b)]

    def fill(writer: Any) -> None:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        writer.add_name(adapter.name)

    infos = [(name, tuple(array.shape), TensorPlan(name, "F32")) for name, array in tensors]

    def stream() -> Any:
        for (name, array), (_, _, plan) in zip(tensors, infos):
            yield name, array, plan

    write_gguf(out, spec.gguf_arch, fill, infos, stream)
    return out


BESIDE = "adapter-lora-f32.gguf"  # the GGUF LoRA `lora_beside` keeps in the adapter's own folder


def lora_beside(adapter: str | Path, base_model: str | Path) -> Path:
    """`adapter`'s GGUF LoRA in its own folder, written when missing or older than the adapter's weights."""
    adapter = Path(adapter)
    out = adapter / BESIDE
    if not out.is_file() or out.stat().st_mtime < (adapter / "adapter_model.safetensors").stat().st_mtime:
        write_lora_gguf(adapter, base_model, out)
    return out
