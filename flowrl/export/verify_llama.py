"""Check a GGUF file by running it in llama.cpp (llama-cpp-python) and comparing logits with the merged model.

llama.cpp is what Ollama runs, so this checks the file the way it will be served, where `verify.py` checks it
with transformers' GGUF reader (a different implementation that can forgive, or miss, what llama.cpp reads
differently: `tokenizer.ggml.pre`, attention biases, hyper-parameter keys). Both use the same prompts, token
ids (the merged model's tokenizer and chat template) and references (`verify.reference_logits`):

1. **Conversion check**: llama.cpp's logits against the merged model whose weights went through the file's
   quantise -> dequantise round trip. Unlike transformers, llama.cpp also rounds the activations: to f16 (bf16)
   before an f16 (bf16) matrix product, to 8-bit blocks (Q8_0/Q8_1) before a block-quantised one. So the figure
   is not 0 for a correct file, and the bound depends on the type (`LLAMA_CONVERSION_TOLERANCES`). Measured on
   the tiny test models and on SmolLM2-135M-Instruct (relative logit error, worst prompt):

       f16 0.0007-0.0016, bf16 0.008, q8_0 0.015-0.037, q5_0 0.035, q5_1 0.058, q4_1 0.037, q4_0 0.014-0.068

   A file written without the Q/K permutation measures 0.41-0.44 (tiny) and 0.73-0.97 (SmolLM2), so each bound
   sits 2-3x above the correct figure and well below the broken one.
2. **Quantisation drift** against the unquantised merged model, bounded by `verify.TOLERANCES` (the same limits
   as the transformers check; llama.cpp measured f16 0.002, q8_0 0.056, q4_0 0.54 on SmolLM2). Also reported:
   max |Δlogit|, top-1 agreement per position and mean KL(reference || llama.cpp).

The rendered prompts are also tokenized by llama.cpp itself (`Llama.tokenize(text, add_bos=False,
special=True)`) and compared with the merged model's tokenizer. A difference is a warning, not a failure (the
logits above are compared on the same ids, so the weights are fine), but a serious one: llama.cpp and Ollama
tokenize the agent's prompts at serve time, so the served model would read ids it was not trained on.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from flowrl.export.errors import ExportError, VerificationError
from flowrl.export.gguf_writer import read_config
from flowrl.export.llama_quiet import ignore_llama_devnull
from flowrl.export.quantize import check_quant
from flowrl.export.verify import (
    DEFAULT_PROMPTS,
    TOLERANCES,
    PromptCheck,
    VerificationReport,
    _encode,
    _rel,
    reference_logits,
    render_prompt,
)

log = logging.getLogger(__name__)

VERIFIER = "llama.cpp"
INSTALL_HINT = (
    "pip install 'flowrl[llama]' (it builds llama.cpp from source: needs a C compiler, a few minutes), "
    "or use --verify transformers"
)

# Relative logit error allowed against the merged model with the same weight round trip (see the docstring).
LLAMA_CONVERSION_TOLERANCES: dict[str, float] = {
    "f16": 5e-3,
    "bf16": 2e-2,
    "q8_0": 0.1,
    "q5_1": 0.15,
    "q5_0": 0.15,
    "q4_1": 0.15,
    "q4_0": 0.15,
}


def require_llama_cpp() -> Any:
    """The `llama_cpp` module, or an ExportError (one line) saying how to install it: never a silent fall-back."""
    ignore_llama_devnull()
    try:
        import llama_cpp
    except ImportError as exc:
        raise ExportError(
            f"--verify llama.cpp needs llama-cpp-python, which is not importable ({exc}): {INSTALL_HINT}"
        ) from exc
    return llama_cpp


def _threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _over(value: float, limit: float) -> bool:
    """`value` breaks `limit`; NaN and infinity (a file that computes garbage) always do."""
    return not (math.isfinite(value) and value <= limit)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_llama(
    gguf_path: Path, encoded: list[tuple[str, list[int]]], texts: list[str], *, n_threads: int | None = None
) -> tuple[list[Any], list[list[int]], dict[str, str], int]:
    """Load `gguf_path` in llama.cpp and return each prompt's logits (positions x vocabulary, float32), llama.cpp's
    own tokenization of each text, the file's metadata and its vocabulary size. The model is freed on return."""
    import numpy as np

    llama_cpp = require_llama_cpp()
    n_ctx = max(len(ids) for _, ids in encoded) + 16
    try:
        llm = llama_cpp.Llama(
            model_path=str(gguf_path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=n_threads or _threads()
        )
    except Exception as exc:
        raise VerificationError(f"llama.cpp cannot load {gguf_path}: {exc}") from exc
    try:
        logits = []
        for _, ids in encoded:
            llm.reset()
            llm.eval(ids)
            logits.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
        tokenized = [list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)) for text in texts]
        return logits, tokenized, dict(llm.metadata), int(llm.n_vocab())
    finally:
        llm.close()


def verify_gguf_llama(
    gguf_path: str | os.PathLike[str],
    reference_dir: str | os.PathLike[str],
    quant: str,
    *,
    prompts: tuple[str, ...] | list[str] | None = None,
    raise_on_failure: bool = True,
    n_threads: int | None = None,
) -> VerificationReport:
    """Run `gguf_path` in llama.cpp and compare it with the merged model in `reference_dir` on the same ids.

    Raises ExportError when llama_cpp is not importable, and VerificationError (listing every failing prompt and
    figure) when a bound is broken, unless `raise_on_failure` is False.
    """
    import torch
    from transformers import AutoTokenizer

    gguf_path, reference_dir = Path(gguf_path), Path(reference_dir)
    quant = check_quant(quant)
    tol = TOLERANCES[quant]
    report = VerificationReport(
        gguf_path=gguf_path, quant=quant, verifier=VERIFIER, conversion_limit=LLAMA_CONVERSION_TOLERANCES[quant]
    )
    config = read_config(reference_dir)
    ref_tok = AutoTokenizer.from_pretrained(str(reference_dir))
    chosen = list(prompts or DEFAULT_PROMPTS)
    encoded = [(p, _encode(ref_tok, p)) for p in chosen]
    texts = [render_prompt(ref_tok, p) for p in chosen]

    got_all, llama_tokens, metadata, n_vocab = run_llama(gguf_path, encoded, texts, n_threads=n_threads)
    if n_vocab != int(config["vocab_size"]):
        raise VerificationError(
            f"{gguf_path}: llama.cpp reads a vocabulary of {n_vocab} tokens, the merged model has "
            f"{config['vocab_size']}: the file's tokenizer or output tensor is wrong"
        )
    plain, simulated = reference_logits(reference_dir, config, quant, encoded)

    for (prompt, ids), text, ours, ref, sim, got_np in zip(encoded, texts, llama_tokens, plain, simulated, got_all):
        got = torch.from_numpy(got_np)
        ref_log, got_log = ref.log_softmax(-1), got.log_softmax(-1)
        hf_tokens = list(ref_tok(text, add_special_tokens=False)["input_ids"])
        check = PromptCheck(
            prompt=prompt,
            n_tokens=len(ids),
            conversion_rel_error=_rel(sim, got),
            drift_rel_error=_rel(ref, got),
            top1_agreement=float((ref.argmax(-1) == got.argmax(-1)).float().mean()),
            mean_kl=float((ref_log.exp() * (ref_log - got_log)).sum(-1).mean()),
            tokens_match=ours == hf_tokens,
            max_abs_error=float((ref - got).abs().max()),
        )
        report.checks.append(check)
        if _over(check.conversion_rel_error, report.conversion_limit):
            report.failures.append(
                f"{prompt!r}: llama.cpp's logits differ from the merged model with {quant} weights by "
                f"{check.conversion_rel_error:.3g} (limit {report.conversion_limit:g} for {quant}; max |Δlogit| "
                f"{check.max_abs_error:.3g}, top-1 agreement {check.top1_agreement:.0%}): the conversion is wrong"
            )
        if _over(check.drift_rel_error, tol.max_rel_error):
            report.failures.append(
                f"{prompt!r}: in llama.cpp, {quant} moves the logits by {check.drift_rel_error:.3f} "
                f"(limit {tol.max_rel_error} for {quant}; mean KL {check.mean_kl:.3g})"
            )
        if check.top1_agreement < tol.warn_top1_below:
            report.warnings.append(
                f"{prompt!r}: in llama.cpp only {check.top1_agreement:.0%} of next-token predictions agree with the "
                f"unquantised model under {quant}; a higher-precision type keeps more of it"
            )
        if not check.tokens_match:
            at = _first_difference(ours, hf_tokens)
            report.warnings.append(
                f"{prompt!r}: llama.cpp tokenizes this rendered prompt differently from the merged model's tokenizer "
                f"(from token {at}: llama.cpp {ours[at : at + 3]}, transformers {hf_tokens[at : at + 3]}). llama.cpp "
                "and Ollama tokenize the agent's prompts at serve time, so the served model would read ids it was "
                "not trained on: check tokenizer.ggml.pre in the file"
            )
    template = getattr(ref_tok, "chat_template", None)
    if isinstance(template, str) and metadata.get("tokenizer.chat_template") != template:
        report.warnings.append("the chat template llama.cpp reads from the GGUF differs from the merged model's")

    return report.conclude(reference_dir, raise_on_failure)
