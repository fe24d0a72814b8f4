"""ExportPipeline and `flowrl export`: adapter -> merged safetensors -> GGUF -> verified -> Modelfile; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("gguf")

from helpers_export import save_tiny_adapter, save_tiny_model  # noqa: E402

from flowrl.cli import main  # noqa: E402
from flowrl.export import ExportPipeline, VerificationError, merge_adapter  # noqa: E402
from flowrl.export.errors import ExportError  # noqa: E402


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train")
    base = save_tiny_model(root / "base")
    return save_tiny_adapter(base, root / "adapter")


def _logits(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([[5, 17, 42, 99, 3]])).logits


def test_merge_folds_the_adapter_into_the_base(adapter_dir: Path, tmp_path: Path) -> None:
    import torch

    result = merge_adapter(adapter_dir, tmp_path / "merged")
    assert result.merged and result.path == tmp_path / "merged"
    assert (result.path / "model.safetensors").is_file() and (result.path / "tokenizer.json").is_file()
    assert not (result.path / "adapter_config.json").exists()
    base = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    merged, original = _logits(result.path), _logits(Path(base))
    assert not torch.allclose(merged, original, atol=1e-3)  # the adapter changed the model

    import torch as _t
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with _t.no_grad():
        peft_model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base, dtype=_t.float32), str(adapter_dir)
        )
        expected = peft_model(_t.tensor([[5, 17, 42, 99, 3]])).logits
    assert torch.allclose(merged, expected, atol=1e-4)
    assert not list(tmp_path.glob(".*partial*"))


def test_pipeline_exports_a_verified_gguf_and_a_modelfile(adapter_dir: Path, tmp_path: Path) -> None:
    steps: list[str] = []
    result = ExportPipeline(adapter_dir, tmp_path / "out", quant="q8_0", name="tiny", progress=steps.append).run()
    out = tmp_path / "out"
    assert result.model_dir == out / "merged"
    assert result.gguf_path == out / "tiny-q8_0.gguf" and result.gguf_path.is_file()
    assert result.verification and "conversion error" in result.verification
    modelfile = (out / "Modelfile").read_text()
    assert "FROM ./tiny-q8_0.gguf" in modelfile and "TEMPLATE" in modelfile
    assert result.ollama_command == f"ollama create tiny -f {out / 'Modelfile'}"
    record = json.loads((out / "export.json").read_text())
    assert record["quant"] == "q8_0" and record["gguf_path"] == str(result.gguf_path)
    assert any("verifying" in s for s in steps)


def test_pipeline_safetensors_format_points_the_modelfile_at_the_merged_folder(
    adapter_dir: Path, tmp_path: Path
) -> None:
    result = ExportPipeline(adapter_dir, tmp_path / "out", format="safetensors").run()
    assert result.gguf_path is None and result.verification is None
    assert "FROM ./merged" in (tmp_path / "out" / "Modelfile").read_text()


def test_failed_verification_keeps_no_usable_gguf(adapter_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import flowrl.export.gguf_writer as gw

    monkeypatch.setitem(gw.ARCHITECTURES, "LlamaForCausalLM", gw.ArchSpec("llama", permute_qk=False))
    with pytest.raises(VerificationError):
        ExportPipeline(adapter_dir, tmp_path / "out", quant="f16").run()
    assert not list((tmp_path / "out").glob("*.gguf"))
    assert list((tmp_path / "out").glob("*.gguf.failed-verification"))
    assert not (tmp_path / "out" / "Modelfile").exists()


def test_cli_export_end_to_end(adapter_dir: Path, tmp_path: Path, capsys) -> None:
    code = main(
        [
            "export",
            "--model",
            str(adapter_dir),
            "--out",
            str(tmp_path / "out"),
            "--quant",
            "q4_0",
            "--ollama",
            "flowrl-tiny",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "verified" in text and "q4_0" in text
    assert "ollama create flowrl-tiny -f" in " ".join(text.split())  # not installed here: the command is printed
    assert (tmp_path / "out" / "model-q4_0.gguf").is_file()


def test_cli_reports_a_folder_without_adapter_or_config(tmp_path: Path, capsys) -> None:
    code = main(["export", "--model", str(tmp_path), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "no adapter_config.json or config.json" in err and err.count("\n") == 1


def test_adapter_config_without_weights_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "x"}')
    with pytest.raises(ExportError, match="no adapter weights"):
        ExportPipeline(tmp_path, tmp_path / "out").run()


def test_missing_base_model_is_a_clear_error(adapter_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="base model"):
        merge_adapter(adapter_dir, tmp_path / "m", base_model=str(tmp_path / "does-not-exist"))


def test_full_model_folder_is_used_as_is(tmp_path: Path) -> None:
    model_dir = save_tiny_model(tmp_path / "model")
    result = ExportPipeline(model_dir, tmp_path / "out", quant="f16", verify=False).run()
    assert result.model_dir == model_dir and not (tmp_path / "out" / "merged").exists()
    assert result.verification is None and result.gguf_path.is_file()


def test_unknown_format_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="gguf or safetensors"):
        ExportPipeline(tmp_path, tmp_path / "out", format="onnx")


def test_cli_export_prints_its_steps_and_no_library_noise(adapter_dir: Path, tmp_path: Path) -> None:
    """`flowrl export` ended in transformers' FutureWarning and its "Loading weights" / "Writing model shards" /
    "Converting and de-quantizing" bars between its own lines (issue 39)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "flowrl.cli", "export", "--model", str(adapter_dir), "--out", str(tmp_path / "e")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    noise = ("Warning", "Loading weights", "Writing model shards", "de-quantizing", "it/s]")
    assert [line for line in (done.stdout + done.stderr).splitlines() if any(n in line for n in noise)] == []
    assert "merged model" in done.stdout and "Modelfile" in done.stdout
