"""Command options generated from a config model's fields, as TRL's `TrlParser` makes flags of its dataclasses.

A field is on the command line when its `Field(...)` says how: `json_schema_extra={"flag": "--lr"}` (a bool's
flag pair reads "--merge/--no-merge"), and its help is the field's `description`. The command keeps only the
parameters that are not one field each and receives the others in `**fields`, None where not given:

    @config_options(TrainingConfig)
    def train(config: Path | None = typer.Option(None, "--config"), **fields: Any) -> None:
        cfg = TrainingConfig.from_dict(load_config_file(config), **fields)

A field declared once is its flag, its help, its type and its check (the model's own validation).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel


def cli_fields(model: type[BaseModel]) -> dict[str, tuple[str, str, Any]]:
    """field name -> (flag, help, the type typer parses) for each field of `model` that has a flag."""
    out = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = extra.get("flag")
        if isinstance(flag, str):
            out[name] = (flag, info.description or "", _parsed_type(info.annotation))
    return out


def _parsed_type(annotation: Any) -> Any:
    """What typer parses for a field: its scalar type (a Literal as str, a list as a comma-separated str); the
    model validates the value."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _parsed_type(args[0])
    if origin is typing.Literal or origin is list:
        return str
    if annotation in (bool, int, float, str, Path):
        return annotation
    raise TypeError(f"a field of type {annotation!r} cannot be a flag: declare its option in the command")


def config_options(model: type[BaseModel]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One option per flagged field of `model`, then the command's own parameters (see the module's doc)."""
    fields = cli_fields(model)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
        hints = typing.get_type_hints(command)
        generated = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=typer.Option(None, *flag.split(), help=help_text),
                annotation=typing.Optional[parsed],  # noqa: UP045  # typer reads this annotation at run time
            )
            for name, (flag, help_text, parsed) in fields.items()
        ]
        taken = {p.name for p in own}
        clash = taken & set(fields)
        if clash:
            raise TypeError(f"{command.__name__}: {', '.join(sorted(clash))} declared twice")

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            return command(**kwargs)

        params = generated + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
        wrapper.__annotations__ = {
            **{p.name: hints.get(p.name, Any) for p in own},
            **{p.name: p.annotation for p in generated},
        }
        return wrapper

    return decorate
