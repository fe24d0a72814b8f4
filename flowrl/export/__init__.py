"""Export: merge a LoRA adapter, write GGUF (F16 to Q4_0, in Python), verify it, write an Ollama Modelfile.

Importing this package is light: torch, transformers, peft and gguf are imported inside the functions
that use them. Public names resolve on first use.
"""

from __future__ import annotations

from flowrl._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ExportError": "flowrl.export.errors",
    "UnsupportedArchitectureError": "flowrl.export.errors",
    "VerificationError": "flowrl.export.errors",
    "TemplateConversionError": "flowrl.export.errors",
    "merge_adapter": "flowrl.export.merge",
    "MergeResult": "flowrl.export.merge",
    "GGUFExporter": "flowrl.export.gguf_writer",
    "GGUFResult": "flowrl.export.gguf_writer",
    "ARCHITECTURES": "flowrl.export.gguf_writer",
    "QUANT_TYPES": "flowrl.export.quantize",
    "verify_gguf": "flowrl.export.verify",
    "verify_gguf_llama": "flowrl.export.verify_llama",
    "VerificationReport": "flowrl.export.verify",
    "TOLERANCES": "flowrl.export.verify",
    "OllamaDeployer": "flowrl.export.ollama",
    "build_modelfile": "flowrl.export.ollama",
    "ExportPipeline": "flowrl.export.pipeline",
    "ExportResult": "flowrl.export.pipeline",
    "use_model": "flowrl.export.agent",
    "restore_model": "flowrl.export.agent",
    "ollama_model": "flowrl.export.agent",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
