"""Config fields that are also command-line options, declared once: flag and help beside the default.

`flag(...)` is a pydantic `Field` (`TrainingConfig`: the model's validation checks the value, `checks` are
pydantic's `ge=1`...). `option(...)` is a dataclass field (`ImproveConfig`, `flowrl build-dataset`'s options:
`checks` are typer's `min=1`..., and the default is the option's default too). `flowrl.cli.options` makes the
typer options of a command from them. This module imports only pydantic and the standard library, so a config
module at any layer may use it and `flowrl --help` stays fast.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field


def flag(default: Any, flag: str, help: str, **checks: Any) -> Any:
    """A pydantic field that is also an option (flowrl.cli.options): its flag, its help, its checks."""
    return Field(default, description=help, json_schema_extra={"flag": flag}, **checks)


def option(default: Any, flag: str, help: str, **checks: Any) -> Any:
    """A dataclass field that is also an option: its default (`...`: required), its flag ("--rounds -r"; a bool's
    pair reads "--dedupe/--no-dedupe"), its help and typer's checks (`min=1`)."""
    metadata = {"flag": flag, "help": help, "checks": checks}
    if default is ...:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)
