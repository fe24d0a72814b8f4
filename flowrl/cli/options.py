"""Command options generated from a config's fields, as TRL's `TrlParser` makes flags of its dataclasses.

A field is on the command line when it says how (`flowrl.flags`). In a pydantic model, `flag(...)`:
`Field(..., description=HELP, json_schema_extra={"flag": "--lr"})` (a bool's flag pair reads
"--merge/--no-merge"); the command receives None where an option is not given, so a config file can fill it.
In a dataclass, `option(...)`: `field(metadata={"flag", "help", "checks"})`; the option's default is the
field's (none: required) and typer applies the checks (`min=1`). The command keeps only the parameters that are
not one field each and receives the others in `**fields`:

    @config_options(TrainingConfig)
    def train(config: Path | None = typer.Option(None, "--config"), **fields: Any) -> None:
        cfg = TrainingConfig.from_dict(load_config_file(config), **fields)

A field declared once is its flag, its help, its type and its check.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer


def cli_fields(model: type[Any]) -> dict[str, tuple[str, str, Any]]:
    """field name -> (flag, help, the type typer parses) for each field of `model` (a pydantic model or a
    dataclass) that has a flag."""
    if dataclasses.is_dataclass(model):
        hints = typing.get_type_hints(model)
        return {
            f.name: (f.metadata["flag"], f.metadata.get("help", ""), _parsed_type(hints[f.name]))
            for f in dataclasses.fields(model)
            if isinstance(f.metadata.get("flag"), str)
        }
    out = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = extra.get("flag")
        if isinstance(flag, str):
            out[name] = (flag, info.description or "", _parsed_type(info.annotation))
    return out


def _default_and_checks(model: type[Any]) -> dict[str, tuple[Any, dict[str, Any]]]:
    """field name -> (the option's default, typer's checks): a dataclass field's own; None and none for a
    pydantic model's (its validation checks)."""
    if not dataclasses.is_dataclass(model):
        return {}
    return {
        f.name: (... if f.default is dataclasses.MISSING else f.default, dict(f.metadata.get("checks", {})))
        for f in dataclasses.fields(model)
    }


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


def config_options(model: type[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One option per flagged field of `model`, then the command's own parameters (see the module's doc)."""
    fields = cli_fields(model)
    given = _default_and_checks(model)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
        hints = typing.get_type_hints(command)
        generated = []
        for name, (flag, help_text, parsed) in fields.items():
            default, checks = given.get(name, (None, {}))
            generated.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=typer.Option(default, *flag.split(), help=help_text, **checks),
                    # typer reads this annotation at run time
                    annotation=parsed if default is not None else typing.Optional[parsed],  # noqa: UP045
                )
            )
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
