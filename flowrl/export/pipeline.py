"""ExportPipeline: adapter (or merged model) folder -> merged safetensors -> GGUF -> verification -> Modelfile.

Layout of `out_dir` after a GGUF export:

    out_dir/
      merged/             the merged Hugging Face model (safetensors + tokenizer); absent when the input
                          already was a full model
      model-q8_0.gguf     the GGUF file (name: `{name}-{quant}.gguf`)
      Modelfile           FROM ./model-q8_0.gguf, TEMPLATE, SYSTEM, PARAMETER stop/temperature/num_ctx
      export.json         what was done: paths, tensor types, fall-backs, which verifier ran and its figures,
                          the command

With `format="safetensors"` the GGUF and verification steps are skipped and the Modelfile points at the
merged folder (Ollama imports safetensors folders of the Llama family directly).

An `out_dir` that already holds an export (any of the files above) is refused unless `overwrite=True`,
which removes those files first (never anything else in the folder).

`verify` picks how the GGUF is checked: "transformers" (load it back with transformers' GGUF reader,
`verify.py`), "llama.cpp" (run it in llama-cpp-python, `verify_llama.py`: what Ollama serves it with), "both"
or "none"; True and False mean "transformers" and "none". Asking for llama.cpp without llama_cpp importable
fails at once, before any work, and never falls back to transformers.

A GGUF that fails verification is renamed to `*.gguf.failed-verification` (kept for inspection, never
picked up by a Modelfile) and VerificationError is raised.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrl.export.errors import ExportError, VerificationError
from flowrl.export.gguf_writer import GGUFExporter
from flowrl.export.merge import merge_adapter, model_kind
from flowrl.export.ollama import OllamaDeployer
from flowrl.export.quantize import check_quant
from flowrl.export.verify import verify_gguf
from flowrl.export.verify_llama import require_llama_cpp, verify_gguf_llama

if TYPE_CHECKING:
    from flowrl.export.verify import VerificationReport

log = logging.getLogger(__name__)

FORMATS = ("gguf", "safetensors")
VERIFIERS = ("transformers", "llama.cpp", "both", "none")


def verifiers(verify: bool | str) -> tuple[str, ...]:
    """The checks `verify` asks for, in the order they run: () for none, both for "both"."""
    if isinstance(verify, bool):
        return ("transformers",) if verify else ()
    choice = verify.strip().lower()
    if choice not in VERIFIERS:
        raise ExportError(f"unknown verifier {verify!r}: use {', '.join(VERIFIERS[:-1])} or {VERIFIERS[-1]}")
    return {"both": ("transformers", "llama.cpp"), "none": ()}.get(choice, (choice,))


@dataclass
class ExportResult:
    out_dir: Path
    model_dir: Path  # the merged (or given full) model folder
    gguf_path: Path | None = None
    modelfile: Path | None = None
    ollama_command: str | None = None
    ollama_created: bool = False
    verification: str | None = None  # "VERIFIER: summary" for each verifier that ran, joined by "; "
    verifier: str = "none"  # transformers, llama.cpp, both or none
    verification_figures: dict[str, dict[str, Any]] = field(default_factory=dict)  # verifier -> worst figures
    tensor_fallbacks: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


class ExportPipeline:
    """Run the whole export. `progress(step)` is called with a short text before each step (for a CLI)."""

    def __init__(  # noqa: PLR0913  # keyword-only options of `flowrl export`
        self,
        model: str | os.PathLike[str],
        out_dir: str | os.PathLike[str],
        *,
        format: str = "gguf",
        quant: str = "q8_0",
        ollama_name: str | None = None,
        verify: bool | str = True,
        base_model: str | None = None,
        dtype: str = "auto",
        name: str = "model",
        prompts: list[str] | None = None,
        progress: Callable[[str], None] | None = None,
        overwrite: bool = False,
    ) -> None:
        if format not in FORMATS:
            raise ExportError(f"unknown format {format!r}: use {' or '.join(FORMATS)}")
        self.model = Path(model)
        self.out_dir = Path(out_dir)
        self.format = format
        self.quant = check_quant(quant)
        self.ollama_name = ollama_name
        self.verifiers = verifiers(verify)
        self.verify = {0: "none", 2: "both"}.get(len(self.verifiers)) or self.verifiers[0]
        if "llama.cpp" in self.verifiers and format == "gguf":
            require_llama_cpp()  # fail before the merge, not minutes later
        self.base_model = base_model
        self.dtype = dtype
        self.name = name
        self.prompts = prompts
        self.progress = progress or (lambda step: None)
        self.overwrite = overwrite

    def run(self) -> ExportResult:
        kind = model_kind(self.model)  # fails fast on a folder without adapter or config
        self._prepare_out()
        self.progress("merging the adapter into the base model" if kind == "adapter" else "using the full model as is")
        merged = merge_adapter(self.model, self.out_dir / "merged", base_model=self.base_model, dtype=self.dtype)
        result = ExportResult(out_dir=self.out_dir, model_dir=merged.path)
        if self.format == "gguf":
            result.verifier = self.verify

        source: Path = merged.path
        if self.format == "gguf":
            source = self._gguf(merged.path, result)

        self.progress("writing the Ollama Modelfile")
        deployer = OllamaDeployer(self.ollama_name or self.name)
        result.modelfile = deployer.write_modelfile(source, merged.path, self.out_dir)
        result.ollama_command = " ".join(deployer.command(result.modelfile))
        if self.ollama_name:
            self.progress(f"registering {self.ollama_name} with Ollama")
            result.ollama_created = deployer.create(result.modelfile).created
        self._write_record(result)
        return result

    def _previous_outputs(self) -> list[Path]:
        if not self.out_dir.is_dir():
            return []
        fixed = [self.out_dir / name for name in ("merged", "Modelfile", "export.json")]
        return (
            [p for p in fixed if p.exists()]
            + sorted(self.out_dir.glob("*.gguf"))
            + sorted(self.out_dir.glob("*.gguf.failed-verification"))
        )

    def _prepare_out(self) -> None:
        """Refuse an `out_dir` holding an export unless `overwrite`; then remove only that export's files."""
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ExportError(f"--out {self.out_dir} is a file: give a folder")
        previous = self._previous_outputs()
        if previous and not self.overwrite:
            raise ExportError(
                f"--out {self.out_dir} already holds an export ({previous[0].name}): "
                "pass --overwrite to replace it, or pick another folder"
            )
        for path in previous:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def _gguf(self, model_dir: Path, result: ExportResult) -> Path:
        path = self.out_dir / f"{self.name}-{self.quant}.gguf"
        self.progress(f"writing {path.name}")
        written = GGUFExporter(self.quant, name=self.ollama_name or self.name).export(model_dir, path)
        result.gguf_path = path
        result.tensor_fallbacks = dict(written.fallbacks)
        result.warnings.extend(written.warnings)
        summaries = []
        for verifier in self.verifiers:
            report = self._verify(verifier, path, model_dir)
            summaries.append(f"{verifier}: {report.summary()}")
            result.verification_figures[verifier] = report.figures()
            result.warnings.extend(report.warnings)
        result.verification = "; ".join(summaries) or None
        return path

    def _verify(self, verifier: str, path: Path, model_dir: Path) -> VerificationReport:
        """Run one verifier on `path`; on failure rename the file so no Modelfile can use it, and re-raise."""
        check: Callable[..., VerificationReport] = verify_gguf
        if verifier == "llama.cpp":
            self.progress("verifying: running the GGUF in llama.cpp and comparing logits")
            check = verify_gguf_llama
        else:
            self.progress("verifying: loading the GGUF back with transformers and comparing logits")
        try:
            return check(path, model_dir, self.quant, prompts=self.prompts)
        except VerificationError:
            failed = path.with_name(path.name + ".failed-verification")
            os.replace(path, failed)
            log.error("kept the failing file as %s", failed)
            raise

    def _write_record(self, result: ExportResult) -> None:
        record = dict(result.to_dict(), format=self.format, quant=self.quant, source=str(self.model))
        path = self.out_dir / "export.json"
        tmp = path.with_name(".export.json.partial")
        tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
        os.replace(tmp, path)
