"""Tensor types for the GGUF writer, and the quantisation itself, done in Python with `gguf.quants`.

Which tensor gets which type (mirrors what llama.cpp's converter and `llama-quantize` do, minus K-quants,
which the `gguf` package cannot write):

| quant  | 2-D weight matrices          | token_embd / output          | 1-D (norms, biases) |
|--------|------------------------------|------------------------------|---------------------|
| f16    | F16                          | F16                          | F32                 |
| bf16   | BF16                         | BF16                         | F32                 |
| q8_0   | Q8_0                         | Q8_0                         | F32                 |
| q5_1   | Q5_1                         | Q8_0                         | F32                 |
| q5_0   | Q5_0                         | Q8_0                         | F32                 |
| q4_1   | Q4_1                         | Q8_0                         | F32                 |
| q4_0   | Q4_0                         | Q8_0 (llama.cpp keeps these  | F32                 |
|        |                              | at higher precision too)     |                     |

Q8_0, Q5_1, Q5_0, Q4_1 and Q4_0 (`gguf.quants`) work in blocks of 32 values along a row. A matrix whose row
length is not a multiple of 32 cannot be stored that way; it falls back to F16 for that tensor alone (logged, and
listed in the export result), which is what llama.cpp's converter does too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from flowrl.export.errors import ExportError

log = logging.getLogger(__name__)

QUANT_TYPES: tuple[str, ...] = ("f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")

# Names of the GGML types, so this table needs no import of `gguf` at module load.
_BLOCKS = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
_MATRIX_TYPE = {"f16": "F16", "bf16": "BF16", **{q: q.upper() for q in _BLOCKS}}
_EMBEDDING_TYPE = {"f16": "F16", "bf16": "BF16", **{q: "Q8_0" for q in _BLOCKS}}
_FILE_TYPE = {"f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", **{q: f"MOSTLY_{q.upper()}" for q in _BLOCKS}}
_BLOCK_TYPES = {q.upper() for q in _BLOCKS}
_EMBEDDING_NAMES = ("token_embd.weight", "output.weight")


def check_quant(quant: str) -> str:
    q = quant.lower()
    if q not in QUANT_TYPES:
        raise ExportError(f"unknown quantisation {quant!r}: use one of {', '.join(QUANT_TYPES)}")
    return q


@dataclass(frozen=True)
class TensorPlan:
    """The GGML type one tensor is written as, and why, when it is not the quant's own type."""

    name: str
    ggml_type: str
    fallback: str | None = None


def plan_tensor(name: str, shape: tuple[int, ...], quant: str) -> TensorPlan:
    """Which GGML type `name` (a GGUF tensor name) of `shape` is stored as under `quant`."""
    quant = check_quant(quant)
    if len(shape) <= 1:
        return TensorPlan(name, "F32")
    wanted = _EMBEDDING_TYPE[quant] if name in _EMBEDDING_NAMES else _MATRIX_TYPE[quant]
    if wanted in _BLOCK_TYPES and shape[-1] % 32 != 0:
        reason = f"row length {shape[-1]} is not a multiple of 32, so {wanted} cannot hold it: stored as F16"
        log.info("%s: %s", name, reason)
        return TensorPlan(name, "F16", fallback=reason)
    return TensorPlan(name, wanted)


def file_type(quant: str) -> int:
    """The `general.file_type` value (llama.cpp's LlamaFileType) for `quant`."""
    import gguf

    return int(getattr(gguf.LlamaFileType, _FILE_TYPE[check_quant(quant)]))


def encode(array: Any, ggml_type: str) -> tuple[Any, Any]:
    """`(data, raw_dtype)` ready for `GGUFWriter.add_tensor(name, data, raw_dtype=...)`.

    `array` is a float32 numpy array. F32 and F16 go in as numpy dtypes (raw_dtype None); BF16 and the
    block types go in as packed uint8 bytes with their GGML type.
    """
    import gguf
    import numpy as np

    array = np.ascontiguousarray(array, dtype=np.float32)
    if ggml_type == "F32":
        return array, None
    if ggml_type == "F16":
        return array.astype(np.float16), None
    qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
    return gguf.quants.quantize(array, qtype), qtype
