"""`flowrl export --verify llama.cpp`: the GGUF run in llama-cpp-python reproduces the merged model's logits and
tokenization; a broken file fails with its figures; without llama_cpp the CLI says how to install it.

The tiny models (helpers_export) measure, against the merged model with the same weight round trip: f16 relative
logit error 0.0006-0.0010 (max |Δlogit| 0.005 on logits of about 3), q8_0 0.013-0.015; a file written without
the Q/K permutation 0.41-0.44. The slow test measures SmolLM2-135M-Instruct, the default model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from helpers_export import save_tiny_model  # noqa: E402

from flowrl.cli import main  # noqa: E402
from flowrl.export import ExportPipeline, GGUFExporter, VerificationError  # noqa: E402
from flowrl.export.errors import ExportError  # noqa: E402

needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed (make setup builds it)"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        "llama": save_tiny_model(root / "llama", attention_bias=True),
        "qwen2": save_tiny_model(root / "qwen2", arch="qwen2"),
    }


def _export(model_dir: Path, quant: str, out: Path) -> Path:
    GGUFExporter(quant).export(model_dir, out)
    return out


@needs_llama
@pytest.mark.parametrize("quant", ["f16", "q8_0"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_cpp_reproduces_the_tiny_models(tiny: dict[str, Path], tmp_path: Path, arch: str, quant: str) -> None:
    from flowrl.export.verify_llama import LLAMA_CONVERSION_TOLERANCES, verify_gguf_llama

    path = _export(tiny[arch], quant, tmp_path / f"{arch}-{quant}.gguf")
    report = verify_gguf_llama(path, tiny[arch], quant)
    assert report.passed and report.verifier == "llama.cpp" and len(report.checks) == 3
    assert all(c.tokens_match for c in report.checks)  # llama.cpp splits the rendered prompts as the tokenizer does
    assert not report.warnings or all("agree" in w for w in report.warnings)
    figures = report.figures()
    assert figures["conversion_rel_error"] < LLAMA_CONVERSION_TOLERANCES[quant] / 3
    if quant == "f16":
        assert figures["max_abs_logit_error"] < 0.02 and figures["top1_agreement"] == 1.0
        assert figures["mean_kl"] < 1e-5
    else:
        assert figures["top1_agreement"] >= 0.9 and figures["mean_kl"] < 1e-3
    assert "max |Δlogit|" in report.summary() and f"limit {LLAMA_CONVERSION_TOLERANCES[quant]:g}" in report.summary()


@needs_llama
@pytest.mark.parametrize("quant", ["f16", "q8_0"])
def test_a_file_without_the_qk_permutation_fails_with_its_figures(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quant: str
) -> None:
    import flowrl.export.gguf_writer as gw
    from flowrl.export.verify_llama import verify_gguf_llama

    monkeypatch.setitem(gw.ARCHITECTURES, "LlamaForCausalLM", gw.ArchSpec("llama", permute_qk=False))
    path = _export(tiny["llama"], quant, tmp_path / "broken.gguf")
    with pytest.raises(VerificationError, match=r"failed verification in llama\.cpp") as caught:
        verify_gguf_llama(path, tiny["llama"], quant)
    message = str(caught.value)
    assert message.count("the conversion is wrong") == 3  # every prompt, each with its figures
    assert "max |Δlogit|" in message and "top-1 agreement" in message and "limit" in message


@needs_llama
def test_a_corrupted_tensor_fails(tiny: dict[str, Path], tmp_path: Path) -> None:
    import numpy as np
    from gguf import GGUFReader

    from flowrl.export.verify_llama import verify_gguf_llama

    path = _export(tiny["qwen2"], "f16", tmp_path / "corrupt.gguf")
    reader = GGUFReader(path, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    tensor.data[...] = np.flip(np.array(tensor.data), axis=-1)  # the right numbers, in the wrong columns
    reader.data.flush()
    del reader
    report = verify_gguf_llama(path, tiny["qwen2"], "f16", raise_on_failure=False)
    assert not report.passed and any("the conversion is wrong" in f for f in report.failures)
    assert report.figures()["conversion_rel_error"] > 0.05


@needs_llama
def test_a_tokenizer_difference_is_reported_as_a_serve_time_problem(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    from flowrl.export.verify_llama import verify_gguf_llama

    real = llama_cpp.Llama.tokenize

    def split_differently(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return real(self, text, add_bos=add_bos, special=special)[::-1]

    monkeypatch.setattr(llama_cpp.Llama, "tokenize", split_differently)
    path = _export(tiny["llama"], "f16", tmp_path / "m.gguf")
    report = verify_gguf_llama(path, tiny["llama"], "f16")
    assert report.passed  # the weights are right: the logits are compared on the same ids
    assert not any(c.tokens_match for c in report.checks) and report.figures()["tokens_match"] is False
    assert any("tokenize the agent's prompts at serve time" in w for w in report.warnings)


@needs_llama
def test_pipeline_and_cli_record_which_verifier_ran(tiny: dict[str, Path], tmp_path: Path, capsys) -> None:
    result = ExportPipeline(tiny["llama"], tmp_path / "a", quant="q8_0", verify="llama.cpp").run()
    assert result.verifier == "llama.cpp" and result.verification and result.verification.startswith("llama.cpp: ")
    record = json.loads((tmp_path / "a" / "export.json").read_text())
    assert record["verifier"] == "llama.cpp" and list(record["verification_figures"]) == ["llama.cpp"]
    figures = record["verification_figures"]["llama.cpp"]
    assert figures["passed"] and figures["max_abs_logit_error"] > 0 and figures["conversion_limit"] == 0.1

    code = main(["export", "--model", str(tiny["qwen2"]), "--out", str(tmp_path / "b"), "--verify", "both"])
    assert code == 0
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert any(line.startswith("verified transformers: 3 prompts") for line in lines)
    assert any(line.startswith("verified llama.cpp: 3 prompts") and "max |Δlogit|" in line for line in lines)
    record = json.loads((tmp_path / "b" / "export.json").read_text())
    assert record["verifier"] == "both" and list(record["verification_figures"]) == ["transformers", "llama.cpp"]


@needs_llama
def test_a_failing_llama_cpp_check_keeps_no_usable_gguf(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flowrl.export.gguf_writer as gw

    monkeypatch.setitem(gw.ARCHITECTURES, "LlamaForCausalLM", gw.ArchSpec("llama", permute_qk=False))
    with pytest.raises(VerificationError, match="llama.cpp"):
        ExportPipeline(tiny["llama"], tmp_path / "out", quant="f16", verify="llama.cpp").run()
    assert not list((tmp_path / "out").glob("*.gguf")) and not (tmp_path / "out" / "Modelfile").exists()
    assert list((tmp_path / "out").glob("*.gguf.failed-verification"))


def test_cli_without_llama_cpp_says_how_to_install_it(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    out = tmp_path / "out"
    code = main(["export", "--model", str(tiny["llama"]), "--out", str(out), "--verify", "llama.cpp"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'flowrl[llama]'" in err and "C compiler" in err
    assert not out.exists()  # refused before any work: no merge, no GGUF, no silent transformers check


def test_verify_choices_and_the_no_verify_synonym(tiny: dict[str, Path], tmp_path: Path, capsys) -> None:
    with pytest.raises(ExportError, match="unknown verifier 'onnx'"):
        ExportPipeline(tiny["llama"], tmp_path / "x", verify="onnx")
    assert ExportPipeline(tiny["llama"], tmp_path / "x", verify=False).verify == "none"
    assert ExportPipeline(tiny["llama"], tmp_path / "x").verify == "transformers"
    code = main(
        ["export", "--model", str(tiny["llama"]), "--out", str(tmp_path / "o"), "--quant", "f16", "--no-verify"]
    )
    assert code == 0 and "skipped (--verify none)" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "export.json").read_text())["verifier"] == "none"
    code = main(
        ["export", "--model", str(tiny["llama"]), "--out", str(tmp_path / "p"), "--no-verify", "--verify", "both"]
    )
    assert code == 2 and "contradict" in capsys.readouterr().err


@pytest.mark.slow
@needs_llama
def test_the_default_model_verifies_in_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2-135M-Instruct, built once from its PyPI wheel (flowrl.models), at f16 and q8_0. Measured: f16
    conversion error 0.0016, max |Δlogit| 0.095 (logits up to about 40), top-1 100%, mean KL 1.3e-5; q8_0
    conversion 0.037, drift 0.056, max |Δlogit| 2.6, top-1 89-96%, mean KL 0.0085."""
    from flowrl.export.verify_llama import verify_gguf_llama
    from flowrl.models import ensure_default_model

    cache = Path(os.environ.get("FLOWRL_TEST_MODELS") or Path.home() / ".cache" / "flowrl" / "models")
    monkeypatch.setenv("FLOWRL_MODELS", str(cache))
    model_dir = ensure_default_model()
    f16 = verify_gguf_llama(_export(model_dir, "f16", tmp_path / "f16.gguf"), model_dir, "f16").figures()
    assert f16["conversion_rel_error"] < 5e-3 and f16["max_abs_logit_error"] < 0.3
    assert f16["top1_agreement"] == 1.0 and f16["mean_kl"] < 1e-4 and f16["tokens_match"]
    q8 = verify_gguf_llama(_export(model_dir, "q8_0", tmp_path / "q8.gguf"), model_dir, "q8_0").figures()
    assert q8["drift_rel_error"] < 0.15 and q8["top1_agreement"] >= 0.85 and q8["mean_kl"] < 0.03
