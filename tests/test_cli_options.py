"""`flowrl train`'s options are generated from `TrainingConfig`, `flowrl improve`'s from `ImproveConfig` and
`flowrl build-dataset`'s from `BuildOptions` (issue 35: `train` re-declared 33 of its fields
by hand, as 40 parameters, and renamed them one by one)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from flowrl.cli.options import cli_fields, config_options
from flowrl.cli.train import train
from flowrl.flags import option
from flowrl.train.config import TrainingConfig


def test_train_takes_one_option_per_flagged_field() -> None:
    params = inspect.signature(train).parameters
    own = {"config", "resume", "resume_from", "lora", "lora_r", "lora_alpha", "trl"}
    assert set(params) - own == set(cli_fields(TrainingConfig))
    assert len(cli_fields(TrainingConfig)) >= 30
    flag, help_text, _ = cli_fields(TrainingConfig)["per_device_train_batch_size"]
    field = TrainingConfig.model_fields["per_device_train_batch_size"]
    assert flag == "--batch-size" and help_text == field.description


class Toy(BaseModel):
    steps: int = Field(1, description="Steps.", json_schema_extra={"flag": "--steps"})
    mode: str = Field("a", description="Mode.", json_schema_extra={"flag": "--mode -m"})
    fast: bool = Field(False, description="Fast.", json_schema_extra={"flag": "--fast/--slow"})
    hidden: int = 3  # no flag: not on the command line


def test_a_generated_command_parses_the_fields_and_keeps_its_own() -> None:
    seen: dict[str, Any] = {}

    @config_options(Toy)
    def run(out: Path = typer.Option(Path("x"), "--out"), **fields: Any) -> None:
        seen.update(fields, out=out)

    app = typer.Typer()
    app.command()(run)
    done = CliRunner().invoke(app, ["--steps", "5", "-m", "b", "--fast", "--out", "y"])
    assert done.exit_code == 0, done.output
    assert seen == {"steps": 5, "mode": "b", "fast": True, "out": Path("y")}
    seen.clear()
    assert CliRunner().invoke(app, []).exit_code == 0
    assert seen == {"steps": None, "mode": None, "fast": None, "out": Path("x")}  # None: not given
    assert "--hidden" not in CliRunner().invoke(app, ["--help"]).output


def test_a_field_given_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="steps declared twice"):

        @config_options(Toy)
        def run(steps: int = typer.Option(1, "--steps"), **fields: Any) -> None: ...


@dataclasses.dataclass
class ToyDataclass:
    name: str = option(..., "--name -n", "Name.")
    steps: int = option(2, "--steps", "Steps.", min=1)
    limit: float | None = option(None, "--limit", "Limit.")
    fast: bool = option(True, "--fast/--slow", "Fast.")
    hidden: int = 3


def test_a_dataclass_gives_its_defaults_and_checks_to_the_options() -> None:
    seen: dict[str, Any] = {}

    @config_options(ToyDataclass)
    def run(**fields: Any) -> None:
        seen.update(fields)

    app = typer.Typer()
    app.command()(run)
    done = CliRunner().invoke(app, ["-n", "a"])
    assert done.exit_code == 0, done.output
    assert seen == {"name": "a", "steps": 2, "limit": None, "fast": True}  # the fields' defaults
    assert ToyDataclass(**seen) == ToyDataclass(name="a")
    assert CliRunner().invoke(app, ["--steps", "3"]).exit_code == 2  # --name is required
    refused = CliRunner().invoke(app, ["-n", "a", "--steps", "0"])
    assert refused.exit_code == 2 and "--steps" in refused.output  # typer applies the field's min=1
    assert "--hidden" not in CliRunner().invoke(app, ["--help"]).output


SNAPSHOT = Path(__file__).parent / "fixtures" / "cli_options.json"
SNAPSHOT_COMMANDS = ("improve", "build-dataset")


def _option_records(name: str) -> list[dict[str, Any]]:
    """Each option of `flowrl NAME` as the user meets it: flags, default, help, type, checks, required."""
    from flowrl.cli import app

    root = typer.main.get_command(app)
    ctx = root.make_context("flowrl", [name], resilient_parsing=True)
    command = root.get_command(ctx, name)  # type: ignore[attr-defined]  # a group: typer's click
    sub = command.context_class(command, info_name=name)
    records = []
    for p in command.params:
        records.append(
            {
                "name": p.name,
                "opts": list(p.opts),
                "secondary_opts": list(p.secondary_opts),
                "default": None if p.default is None else str(p.default),
                "help": getattr(p, "help", None),
                "type": str(p.type_descriptor.annotation),
                "range": [p.min, p.max],
                "required": p.required,
                "is_flag": p.is_flag,
                "help_line": list(p.get_help_record(sub) or []),
            }
        )
    return sorted(records, key=lambda r: r["name"])


def test_improve_and_build_dataset_keep_their_options() -> None:
    """Generating the options from config dataclasses (issue 35) changes neither flag, default, help, type nor
    check of `flowrl improve` and `flowrl build-dataset` (the snapshot was taken from the hand-written commands;
    only their order in `--help` may change)."""
    import json

    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert {name: _option_records(name) for name in SNAPSHOT_COMMANDS} == expected
