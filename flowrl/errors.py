"""Errors raised by flowrl's library code.

Library code raises these; the CLI turns them into one clear line and a non-zero exit.
Messages say what happened and how to fix it.
"""

from __future__ import annotations


class FlowRLError(Exception):
    """Base class of every error flowrl raises on purpose."""


class SchemaError(FlowRLError):
    """A trace file or dict that does not fit the trace schema."""


class StoreError(FlowRLError):
    """The trace store cannot be read or written."""


class ConfigError(FlowRLError):
    """A configuration file or option is invalid."""


class IngestError(FlowRLError):
    """A file given to ingest cannot be read."""


class UnsafePickleError(IngestError):
    """A pickle tried to load a class that is not on the allow-list."""


class SandboxError(FlowRLError):
    """The code sandbox cannot run (not: the code under test failed)."""


class MissingExtraError(FlowRLError, ImportError):
    """An optional dependency group is not installed."""


def require(module: str, extra: str = "train"):
    """Import `module` or raise MissingExtraError naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(f"{module} is not installed: run `pip install 'flowrl[{extra}]'` ({exc})") from exc


class ModelError(FlowRLError):
    """A model cannot be found, fetched, converted or loaded."""


class TrainingError(FlowRLError):
    """Training or evaluation cannot start or cannot go on."""
