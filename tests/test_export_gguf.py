"""GGUF writing: tensor mapping, metadata, tokenizer, quant types, verification, and failure modes."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from helpers_export import save_tiny_model  # noqa: E402

from flowrl.export import GGUFExporter, UnsupportedArchitectureError, VerificationError, verify_gguf  # noqa: E402
from flowrl.export.errors import ExportError  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("llama") / "model")


def _reader(path: Path):
    import gguf

    return gguf.GGUFReader(str(path))


def _field(reader, key: str):
    from transformers.modeling_gguf_pytorch_utils import read_field

    values = read_field(reader, key)
    return values[0] if len(values) == 1 else values


@pytest.mark.parametrize("quant", ["f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0"])
def test_gguf_loads_back_with_matching_logits(llama_dir: Path, tmp_path: Path, quant: str) -> None:
    out = tmp_path / f"model-{quant}.gguf"
    result = GGUFExporter(quant).export(llama_dir, out)
    assert out.is_file() and result.size_bytes == out.stat().st_size
    assert not list(tmp_path.glob(".*partial*"))
    report = verify_gguf(out, llama_dir, quant)
    assert report.passed, report.failures
    assert all(c.conversion_rel_error < 1e-3 for c in report.checks)
    assert all(c.tokens_match for c in report.checks)


def test_tensor_types_follow_the_quant_plan(llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    result = GGUFExporter("q4_0").export(llama_dir, out)
    types = {t.name: t.tensor_type.name for t in _reader(out).tensors}
    assert types == result.tensor_types
    assert types["token_embd.weight"] == "Q8_0"  # embeddings (tied: also the output) stay at 8 bits
    assert types["blk.0.attn_q.weight"] == "Q4_0"
    assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"
    assert "output.weight" not in types  # tied embeddings: llama.cpp reuses token_embd


def test_metadata_and_tokenizer_are_written(llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    GGUFExporter("f16", name="tiny").export(llama_dir, out)
    reader = _reader(out)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "general.name") == "tiny"
    assert _field(reader, "llama.block_count") == 2
    assert _field(reader, "llama.attention.head_count_kv") == 2
    assert _field(reader, "llama.rope.dimension_count") == 16
    assert _field(reader, "llama.vocab_size") == 320
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "smollm"  # digits one by one, then GPT-2's regex
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == 320 and tokens[-1] == "[PAD319]"  # the tokenizer has fewer tokens than the model
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[_field(reader, "tokenizer.ggml.eot_token_id")] == "<|im_end|>"
    assert "<|im_start|>" in _field(reader, "tokenizer.chat_template")
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False


def test_transformers_reads_the_tokenizer_back(llama_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    out = tmp_path / "m.gguf"
    GGUFExporter("q8_0").export(llama_dir, out)
    original = AutoTokenizer.from_pretrained(str(llama_dir))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=out.name)
    messages = [{"role": "user", "content": "def add(a, b): return 12345"}]
    assert loaded.eos_token == "<|im_end|>"
    assert loaded.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    ) == original.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text = "hello <|im_start|>user\nworld<|im_end|>"
    assert loaded(text)["input_ids"] == original(text)["input_ids"]


@pytest.mark.parametrize("arch,bias", [("qwen2", True), ("llama", True)])
def test_attention_biases_and_qwen2_mapping(tmp_path: Path, arch: str, bias: bool) -> None:
    model_dir = save_tiny_model(tmp_path / arch, arch=arch, attention_bias=bias, tie=False)
    out = tmp_path / "m.gguf"
    result = GGUFExporter("q8_0").export(model_dir, out)
    assert result.tensor_types["blk.0.attn_q.bias"] == "F32"
    assert result.tensor_types["output.weight"] == "Q8_0"  # untied: the output projection is written
    assert _field(_reader(out), "general.architecture") == ("qwen2" if arch == "qwen2" else "llama")
    assert verify_gguf(out, model_dir, "q8_0").passed


def test_rows_not_divisible_by_32_fall_back_to_f16(tmp_path: Path) -> None:
    model_dir = save_tiny_model(tmp_path / "odd", intermediate_size=80)
    out = tmp_path / "m.gguf"
    result = GGUFExporter("q4_0").export(model_dir, out)
    assert result.tensor_types["blk.0.ffn_down.weight"] == "F16"  # rows of 80
    assert "multiple of 32" in result.fallbacks["blk.0.ffn_down.weight"]
    assert result.tensor_types["blk.0.ffn_up.weight"] == "Q4_0"  # rows of 64
    assert verify_gguf(out, model_dir, "q4_0").passed


def test_wrong_conversion_fails_verification_loudly(llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import flowrl.export.gguf_writer as gw

    monkeypatch.setitem(gw.ARCHITECTURES, "LlamaForCausalLM", gw.ArchSpec("llama", permute_qk=False))
    out = tmp_path / "broken.gguf"
    GGUFExporter("f16").export(llama_dir, out)
    with pytest.raises(VerificationError, match="the conversion is wrong"):
        verify_gguf(out, llama_dir, "f16")


def test_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    model_dir = tmp_path / "gpt2"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForCausalLM.*Qwen2ForCausalLM"):
        GGUFExporter("f16").export(model_dir, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no config.json"):
        GGUFExporter("f16").export(tmp_path, tmp_path / "m.gguf")


def test_unknown_quant_is_rejected() -> None:
    with pytest.raises(ExportError, match="f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0"):
        GGUFExporter("q4_k_m")


def test_full_disk_leaves_no_partial_file(llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import gguf

    real = gguf.GGUFWriter.write_tensor_data
    calls = {"n": 0}

    def write_then_fail(self, tensor, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", write_then_fail)
    out = tmp_path / "m.gguf"
    with pytest.raises(ExportError, match="disk full.*nothing was left behind"):
        GGUFExporter("f16").export(llama_dir, out)
    assert calls["n"] == 3
    assert list(tmp_path.iterdir()) == []


def test_not_enough_free_space_is_refused_up_front(llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10, 10, 0))
    with pytest.raises(ExportError, match="not enough disk space"):
        GGUFExporter("f16").export(llama_dir, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []


def test_pytorch_bin_weights_are_read_too(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = save_tiny_model(tmp_path / "bin")
    state = AutoModelForCausalLM.from_pretrained(str(model_dir)).state_dict()
    (model_dir / "model.safetensors").unlink()
    torch.save(state, model_dir / "pytorch_model.bin")
    out = tmp_path / "m.gguf"
    GGUFExporter("f16").export(model_dir, out)
    assert verify_gguf(out, model_dir, "f16").passed
