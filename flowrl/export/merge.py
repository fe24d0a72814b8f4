"""Merge a PEFT LoRA adapter into its base model and save the result as safetensors plus tokenizer.

`flowrl train` writes an adapter folder: `adapter_config.json` (with `base_model_name_or_path`),
`adapter_model.safetensors` and the tokenizer files. `merge_adapter` loads the base in float32, applies
the adapter with PEFT, folds it in (`merge_and_unload`) and saves a plain Hugging Face model folder that
transformers, llama.cpp and Ollama can read. The folder is written under a temporary name next to the
target and renamed into place when complete, so a failed merge leaves nothing half-written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import FlowRLError, require
from flowrl.export.errors import ExportError
from flowrl.models import resolve_model

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


@dataclass
class MergeResult:
    path: Path  # the merged (or already full) model folder
    merged: bool  # False when the input already was a full model
    base_model: str | None = None
    dtype: str | None = None


def model_kind(model_dir: Path) -> str:
    """'adapter', 'model', or raise ExportError saying what the folder lacks."""
    if not model_dir.is_dir():
        raise ExportError(
            f"{model_dir} is not a folder: pass the adapter folder `flowrl train` wrote, or a Hugging Face model folder"
        )
    if (model_dir / ADAPTER_CONFIG).is_file():
        if not any((model_dir / name).is_file() for name in ADAPTER_WEIGHTS):
            raise ExportError(
                f"{model_dir} has {ADAPTER_CONFIG} but no adapter weights "
                f"({' or '.join(ADAPTER_WEIGHTS)}): the training run did not finish saving"
            )
        return "adapter"
    if (model_dir / "config.json").is_file():
        if not (any(model_dir.glob("*.safetensors")) or any(model_dir.glob("pytorch_model*.bin"))):
            raise ExportError(f"{model_dir} has config.json but no weights (*.safetensors)")
        return "model"
    raise ExportError(
        f"no {ADAPTER_CONFIG} or config.json in {model_dir}: pass the adapter folder `flowrl train` "
        "wrote (it holds adapter_config.json and adapter_model.safetensors), or a merged model folder"
    )


def _resolve_base(adapter_dir: Path, base: str) -> str:
    """The base model as written in adapter_config.json, made absolute when it is a local folder."""
    for candidate in (Path(base).expanduser(), adapter_dir / base):
        if (candidate / "config.json").is_file():
            return str(candidate.resolve())
    try:  # flowrl's model names (`smollm2-135m`, the embedded default) resolve like `flowrl train` resolves them
        return resolve_model(base).path
    except FlowRLError as exc:
        raise ExportError(
            f"cannot find the base model {base!r} named in {adapter_dir / ADAPTER_CONFIG}: {exc}. "
            "Pass --base-model with a local model folder"
        ) from exc


def _save_dtype(requested: str, base_config: dict[str, Any]) -> str:
    value = requested
    if requested == "auto":  # "bfloat16", or torch.bfloat16 depending on the transformers version
        value = str(base_config.get("dtype") or base_config.get("torch_dtype") or "float32").removeprefix("torch.")
    if value not in _DTYPES:
        raise ExportError(f"unknown dtype {requested!r}: use auto, float32, float16 or bfloat16")
    return _DTYPES[value]


def merge_adapter(
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    base_model: str | None = None,
    dtype: str = "auto",
) -> MergeResult:
    """Merge the adapter in `model_dir` into its base and save it to `out_dir`.

    `base_model` overrides `base_model_name_or_path` from adapter_config.json. `dtype` is the dtype the
    merged weights are saved in: `auto` keeps the base model's. A folder that already holds a full model
    is returned as is (`merged=False`).
    """
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if model_kind(model_dir) == "model":
        return MergeResult(path=model_dir, merged=False)

    torch = require("torch")
    transformers = require("transformers")
    peft = require("peft")

    adapter_config = json.loads((model_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = base_model or adapter_config.get("base_model_name_or_path")
    if not base:
        raise ExportError(f"{model_dir / ADAPTER_CONFIG} names no base_model_name_or_path: pass --base-model DIR")
    base = _resolve_base(model_dir, base)
    try:
        base_config = transformers.AutoConfig.from_pretrained(base).to_dict()
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    except Exception as exc:
        raise ExportError(
            f"cannot load the base model {base!r} named in {model_dir / ADAPTER_CONFIG}: {exc}. "
            "Pass --base-model with a local model folder"
        ) from exc
    tok_dir = model_dir if any((model_dir / f).is_file() for f in TOKENIZER_FILES) else Path(base)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    try:
        model = peft.PeftModel.from_pretrained(model, str(model_dir)).merge_and_unload()
    except Exception as exc:
        raise ExportError(f"cannot apply the adapter in {model_dir} to {base!r}: {exc}") from exc
    save_dtype = _save_dtype(dtype, base_config)
    model = model.to(getattr(torch, save_dtype))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"cannot write the merged model to {out_dir}: {exc}; nothing was left behind") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("merged %s into %s -> %s (%s)", model_dir, base, out_dir, save_dtype)
    return MergeResult(path=out_dir, merged=True, base_model=base, dtype=save_dtype)
