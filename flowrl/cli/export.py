"""`flowrl export`: adapter or model folder -> merged safetensors -> GGUF -> verification -> Modelfile."""

from __future__ import annotations

from pathlib import Path

import typer

from flowrl.cli.common import console, output_folder


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(  # noqa: PLR0913  # a typer command: one parameter per option
    model: Path = typer.Option(
        ..., "--model", help="Adapter folder from `flowrl train`, or a merged Hugging Face model folder."
    ),
    out: Path = typer.Option(..., "--out", help="Output folder (merged/, the .gguf file, Modelfile, export.json)."),
    format: str = typer.Option("gguf", "--format", help="gguf or safetensors."),
    quant: str = typer.Option("q8_0", "--quant", help="f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0 (GGUF only)."),
    ollama: str | None = typer.Option(
        None,
        "--ollama",
        help=(
            "Register the model with Ollama under this name (`ollama create`), "
            "or print the command when Ollama is not installed."
        ),
    ),
    verify: str | None = typer.Option(
        None,
        "--verify",
        help=(
            "How to check the GGUF against the merged model's logits: transformers (the default: its GGUF loader), "
            "llama.cpp (runs the file as Ollama would; needs llama-cpp-python, flowrl's llama extra), both, or none."
        ),
    ),
    no_verify: bool = typer.Option(
        False, "--no-verify", help="Same as --verify none: skip loading the GGUF back and comparing logits."
    ),
    base_model: str | None = typer.Option(
        None, "--base-model", help="Base model folder, overriding base_model_name_or_path in adapter_config.json."
    ),
    dtype: str = typer.Option(
        "auto", "--dtype", help="dtype of the merged safetensors: auto (the base's), float32, float16, bfloat16."
    ),
    name: str = typer.Option("model", "--name", help="File name stem of the GGUF file."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an export already in --out."),
) -> None:
    """Merge the LoRA adapter, write GGUF (quantised in Python), verify it, and write an Ollama Modelfile."""
    from flowrl.export.errors import ExportError  # lazy: keeps `flowrl --help` fast
    from flowrl.export.pipeline import ExportPipeline  # lazy: keeps `flowrl --help` fast

    if no_verify and verify not in (None, "none"):
        raise ExportError(f"--no-verify and --verify {verify} contradict each other: give one of them")
    output_folder(out, "--out", keep=False)  # before minutes of merging; the pipeline makes it once it may
    pipeline = ExportPipeline(
        model,
        out,
        format=format.lower(),
        quant=quant,
        ollama_name=ollama,
        verify="none" if no_verify else (verify or "transformers"),
        base_model=base_model,
        dtype=dtype,
        name=name,
        overwrite=overwrite,
        progress=lambda step: console.print(f"[bold]·[/bold] {step}", highlight=False),
    )
    from flowrl.quiet import quiet_libraries  # lazy: keeps `flowrl --help` fast

    with console.status("exporting"), quiet_libraries(bars=False):  # the steps above say what happens
        result = pipeline.run()
    console.print(f"merged model  {result.model_dir}", highlight=False)
    if result.gguf_path:
        console.print(
            f"GGUF          {result.gguf_path} ({result.gguf_path.stat().st_size / 1e6:.1f} MB, {quant})",
            highlight=False,
        )
    for verifier, figures in result.verification_figures.items():
        console.print(f"verified      {verifier}: {figures['summary']}", highlight=False)
    if result.gguf_path and not result.verification_figures:
        console.print("verified      skipped (--verify none)", highlight=False)
    for tensor, reason in result.tensor_fallbacks.items():
        console.print(f"[yellow]fallback[/yellow] {tensor}: {reason}", highlight=False)
    for warning in result.warnings:
        console.print(f"[yellow]warning[/yellow] {warning}", highlight=False)
    console.print(f"Modelfile     {result.modelfile}", highlight=False)
    if result.ollama_created:
        console.print(
            f"ollama        created {ollama}; use it with use_model(agent, 'ollama/{ollama}')", highlight=False
        )
    elif ollama:
        console.print(
            f"ollama        not on PATH here; run where Ollama is installed: {result.ollama_command}", highlight=False
        )
    else:
        console.print(f"ollama        to register it: {result.ollama_command}", highlight=False)
