"""Check a GGUF file by loading it back with transformers' GGUF loader and comparing logits.

Two comparisons per prompt, both on the same token ids (the merged model's tokenizer and chat template):

1. **Conversion check** (the one that catches bugs): the GGUF model against the merged model whose weights
   went through the *same* quantise -> dequantise round trip, tensor by tensor, as the file's tensors did.
   Any mistake in tensor names, Q/K permutation, hyper-parameters, tied embeddings or tensor types shows
   here, at every quant type, so the bound is tight: relative logit error <= 1e-3.
2. **Quantisation drift**: the GGUF model against the unquantised merged model. This is what the quant type
   costs. It is reported (relative error, top-1 agreement, mean KL) and bounded per type (`TOLERANCES`).
   The bounds were set on SmolLM2-135M-Instruct, a model small enough that 4-bit weights move its logits a
   lot (Q4_0: relative error about 0.5, mean KL about 0.8); bigger models drift less.

The relative error is ||logits_gguf - logits_ref|| / ||logits_ref|| over all positions of a prompt.

The GGUF tokenizer is also loaded back and asked to encode each prompt; a difference is reported as a
warning, not a failure: transformers rebuilds some pre-tokenizers (e.g. SmolLM's digit splitting) only
approximately, while llama.cpp and Ollama use the name written in `tokenizer.ggml.pre`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.export.errors import VerificationError
from flowrl.export.gguf_writer import arch_spec, read_config
from flowrl.export.quantize import check_quant, plan_tensor

log = logging.getLogger(__name__)

DEFAULT_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that adds two numbers.",
    "List the files in /tmp and count them: 1, 2, 3.",
)

CONVERSION_TOLERANCE = 1e-3
_BIAS_FLAGS = ("attention_bias", "mlp_bias")


@dataclass(frozen=True)
class Tolerance:
    max_rel_error: float  # quantisation drift bound (relative logit error vs the unquantised model)
    warn_top1_below: float  # below this top-1 agreement the report carries a warning


TOLERANCES: dict[str, Tolerance] = {
    "f16": Tolerance(max_rel_error=0.01, warn_top1_below=0.99),
    "bf16": Tolerance(max_rel_error=0.05, warn_top1_below=0.95),
    "q8_0": Tolerance(max_rel_error=0.15, warn_top1_below=0.9),
    "q5_1": Tolerance(max_rel_error=0.5, warn_top1_below=0.85),
    "q5_0": Tolerance(max_rel_error=0.5, warn_top1_below=0.85),
    "q4_1": Tolerance(max_rel_error=1.0, warn_top1_below=0.75),
    "q4_0": Tolerance(max_rel_error=1.0, warn_top1_below=0.75),
}


@dataclass
class PromptCheck:
    prompt: str
    n_tokens: int
    conversion_rel_error: float
    drift_rel_error: float
    top1_agreement: float
    mean_kl: float
    tokens_match: bool
    max_abs_error: float | None = None  # largest |logit difference| against the unquantised model, when measured


@dataclass
class VerificationReport:
    gguf_path: Path
    quant: str
    checks: list[PromptCheck] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    verifier: str = "transformers"  # what loaded the file back: transformers or llama.cpp (verify_llama)
    conversion_limit: float = CONVERSION_TOLERANCE

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        if not self.checks:
            return "no prompts checked"
        worst = max(self.checks, key=lambda c: c.drift_rel_error)
        conv = max(c.conversion_rel_error for c in self.checks)
        top1 = min(c.top1_agreement for c in self.checks)
        max_abs = [c.max_abs_error for c in self.checks if c.max_abs_error is not None]
        return (
            f"{len(self.checks)} prompts: conversion error {conv:.1e} (limit {self.conversion_limit:g}), "
            f"{self.quant} drift {worst.drift_rel_error:.3f} (limit {TOLERANCES[self.quant].max_rel_error}), "
            + (f"max |Δlogit| {max(max_abs):.3g}, " if max_abs else "")
            + f"top-1 agreement >= {top1:.2f}, mean KL <= {max(c.mean_kl for c in self.checks):.3g}"
        )

    def conclude(self, reference_dir: Path, raise_on_failure: bool) -> VerificationReport:
        """Log the warnings, then raise VerificationError listing the failures (when asked); `self` otherwise."""
        by = " with llama.cpp" if self.verifier == "llama.cpp" else ""
        for warning in self.warnings:
            log.warning("verify %s%s: %s", self.gguf_path.name, by, warning)
        if self.failures and raise_on_failure:
            where = " in llama.cpp" if self.verifier == "llama.cpp" else ""
            raise VerificationError(
                f"{self.gguf_path} failed verification{where} against {reference_dir}:\n  " + "\n  ".join(self.failures)
            )
        return self

    def figures(self) -> dict[str, Any]:
        """The worst figure of each kind over the prompts, with its limit: what export.json records."""
        checks = self.checks
        max_abs = [c.max_abs_error for c in checks if c.max_abs_error is not None]
        return {
            "verifier": self.verifier,
            "summary": self.summary(),
            "prompts": len(checks),
            "conversion_rel_error": max((c.conversion_rel_error for c in checks), default=None),
            "conversion_limit": self.conversion_limit,
            "drift_rel_error": max((c.drift_rel_error for c in checks), default=None),
            "drift_limit": TOLERANCES[self.quant].max_rel_error,
            "max_abs_logit_error": max(max_abs) if max_abs else None,
            "top1_agreement": min((c.top1_agreement for c in checks), default=None),
            "mean_kl": max((c.mean_kl for c in checks), default=None),
            "tokens_match": all(c.tokens_match for c in checks),
            "passed": self.passed,
        }


def render_prompt(tokenizer: Any, prompt: str) -> str:
    """The text `_encode` tokenizes: `prompt` as a user turn in the tokenizer's chat template, or as it is."""
    if getattr(tokenizer, "chat_template", None):
        return str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        )
    return prompt


def _encode(tokenizer: Any, prompt: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(out["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def _simulate_quantisation(model: Any, config: dict[str, Any], quant: str) -> None:
    """Round-trip every weight of `model` through the GGML type the exporter gives it, in place."""
    import gguf
    import torch

    _, spec = arch_spec(config)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.gguf_arch)
    name_map = gguf.get_tensor_name_map(arch_enum, int(config["num_hidden_layers"]))
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied lm_head shares embed_tokens' parameter: listed once
            gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                continue
            ggml_type = plan_tensor(gguf_name, tuple(param.shape), quant).ggml_type
            if ggml_type == "F32":
                continue
            array = param.detach().to(torch.float32).cpu().numpy()
            if ggml_type == "F16":
                rounded = array.astype("float16").astype("float32")
            else:
                qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
                rounded = gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype)
            param.copy_(torch.from_numpy(rounded.reshape(array.shape)))


def _rel(a: Any, b: Any) -> float:
    return float((a - b).norm() / a.norm().clamp_min(1e-12))


def reference_logits(
    reference_dir: Path, config: dict[str, Any], quant: str, encoded: list[tuple[str, list[int]]]
) -> tuple[list[Any], list[Any]]:
    """The merged model's float32 logits on each prompt's ids: as it is, and with its weights sent through the
    `quant` round trip (`_simulate_quantisation`), the two references every verifier compares a GGUF with."""
    import torch
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(str(reference_dir), dtype=torch.float32)
    ref_model.eval()
    with torch.no_grad():
        plain = [ref_model(torch.tensor([ids])).logits[0] for _, ids in encoded]
        _simulate_quantisation(ref_model, config, quant)
        simulated = [ref_model(torch.tensor([ids])).logits[0] for _, ids in encoded]
    return plain, simulated


def verify_gguf(
    gguf_path: str | os.PathLike[str],
    reference_dir: str | os.PathLike[str],
    quant: str,
    *,
    prompts: tuple[str, ...] | list[str] | None = None,
    raise_on_failure: bool = True,
) -> VerificationReport:
    """Load `gguf_path` with transformers and compare it with the merged model in `reference_dir`.

    Raises VerificationError (listing every failing prompt and metric) unless `raise_on_failure` is False.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path, reference_dir = Path(gguf_path), Path(reference_dir)
    quant = check_quant(quant)
    report = VerificationReport(gguf_path=gguf_path, quant=quant)
    tol = TOLERANCES[quant]
    config = read_config(reference_dir)

    try:
        gguf_config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        # transformers' GGUF reader does not infer bias flags for `llama` files (llama.cpp reads the tensors
        # themselves); take them from the merged model so the bias tensors in the file are loaded and compared.
        for flag in _BIAS_FLAGS:
            if config.get(flag) and hasattr(gguf_config, flag):
                setattr(gguf_config, flag, True)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, config=gguf_config, dtype=torch.float32
        )
        gguf_tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:
        raise VerificationError(f"transformers cannot load {gguf_path} back: {exc}") from exc
    ref_tok = AutoTokenizer.from_pretrained(str(reference_dir))
    gguf_model.eval()

    encoded = [(p, _encode(ref_tok, p)) for p in (prompts or DEFAULT_PROMPTS)]
    plain, simulated = reference_logits(reference_dir, config, quant, encoded)
    with torch.no_grad():
        loaded = [gguf_model(torch.tensor([ids])).logits[0] for _, ids in encoded]

    for (prompt, ids), ref, sim, got in zip(encoded, plain, simulated, loaded):
        kl = torch.nn.functional.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none")
        check = PromptCheck(
            prompt=prompt,
            n_tokens=len(ids),
            conversion_rel_error=_rel(sim, got),
            drift_rel_error=_rel(ref, got),
            top1_agreement=float((ref.argmax(-1) == got.argmax(-1)).float().mean()),
            mean_kl=float(kl.sum(-1).mean()),
            tokens_match=_encode(gguf_tok, prompt) == ids,
        )
        report.checks.append(check)
        if check.conversion_rel_error > CONVERSION_TOLERANCE:
            report.failures.append(
                f"{prompt!r}: logits differ from the merged model with {quant} weights by "
                f"{check.conversion_rel_error:.3g} (limit {CONVERSION_TOLERANCE:.0e}): the conversion is wrong"
            )
        if check.drift_rel_error > tol.max_rel_error:
            report.failures.append(
                f"{prompt!r}: {quant} moves the logits by {check.drift_rel_error:.3f} "
                f"(limit {tol.max_rel_error} for {quant})"
            )
        if check.top1_agreement < tol.warn_top1_below:
            report.warnings.append(
                f"{prompt!r}: only {check.top1_agreement:.0%} of next-token predictions agree with the unquantised "
                f"model under {quant}; a higher-precision type keeps more of it "
                "(q8_0 > q5_1 > q5_0 > q4_1 > q4_0, f16 > bf16)"
            )
        if not check.tokens_match:
            report.warnings.append(
                f"{prompt!r}: the GGUF tokenizer, as transformers rebuilds it, splits this prompt "
                "differently (llama.cpp/Ollama use tokenizer.ggml.pre and may still match)"
            )
    if getattr(ref_tok, "chat_template", None) and getattr(gguf_tok, "chat_template", None) != ref_tok.chat_template:
        report.warnings.append("the chat template read back from the GGUF differs from the merged model's")

    return report.conclude(reference_dir, raise_on_failure)
