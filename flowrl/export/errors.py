"""Errors raised by `flowrl.export`. All are FlowRLError, so the CLI shows them as one clear line."""

from __future__ import annotations

from flowrl.errors import FlowRLError


class ExportError(FlowRLError):
    """The model cannot be merged, converted, written or deployed."""


class UnsupportedArchitectureError(ExportError):
    """The model's architecture has no GGUF mapping here."""


class VerificationError(ExportError):
    """The GGUF file does not reproduce the merged model's logits within tolerance."""


class TemplateConversionError(ExportError):
    """A Jinja chat template that cannot be turned into an Ollama (Go) template."""
