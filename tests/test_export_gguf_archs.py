"""GGUF export of Qwen3 and Gemma 3 text models, checked against transformers' GGUF loader and llama.cpp itself.

Tiny random models built here (no download): hidden 64 so every matrix can be block-quantised, weights and norm
weights drawn wide (std 0.1 and 0.3) so that a wrong tensor transform (a missing Gemma +1, a dropped Q/K norm)
moves the logits far beyond the tolerances. Each model is exported, then

* reloaded by transformers (`verify_gguf`: logits against the merged model put through the same quantisation,
  relative error <= 1e-3), and
* run by llama.cpp (llama-cpp-python, skipped when it is not installed): logits of the same token ids against the
  Hugging Face model with the file's quantisation simulated, and llama.cpp's tokenizer against transformers'.

The Gemma 3 model has 6 layers (5 sliding-window, 1 global, the layout llama.cpp assumes), head_dim 256 and
query_pre_attn_scalar 256 (what llama.cpp and transformers' GGUF loader both assume, as in Gemma 3 1B-12B), and a
sliding window of 4 tokens, far shorter than the prompts, so the window and the local RoPE base are exercised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from helpers_export import _CORPUS, tiny_tokenizer  # noqa: E402

from flowrl.export import GGUFExporter, VerificationError, verify_gguf  # noqa: E402

TEXTS = (
    "hello world, the quick brown fox 12345",
    "def add(a, b):\n    return a + b",
    "What is the capital of France? Zürich ☃ unseen",
)
PROMPTS = (
    "What is the capital of France? Paris. List the files in /tmp and count them.",
    "def add(a, b):\n    return a + b  # hello world, the quick brown fox",
)


def _randomise(model: Any, norm_mean: float) -> None:
    """Make every norm weight count: N(norm_mean, 0.3) instead of the constant init."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(norm_mean, 0.3)


def _save_qwen3(path: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,  # as every Qwen3; transformers' GGUF loader does not read key_length for qwen3
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = Qwen3ForCausalLM(config)
    _randomise(model, 1.0)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def _gemma3_template() -> str:
    """The Gemma 3 chat template TRL ships (`trl/chat_templates/gemma3.jinja`)."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        pytest.skip("trl (which ships the Gemma 3 chat template) is not installed")
    return (Path(spec.origin).parent / "chat_templates" / "gemma3.jinja").read_text(encoding="utf-8")


def gemma_tokenizer() -> Any:
    """A Gemma-3-shaped tokenizer: BPE with byte fallback over `▁`-escaped text, `<bos>` added in front."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=200, show_progress=False)
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizer
    trained.train_from_iterator(_CORPUS * 20, trainer=trainer)
    learned = json.loads(trained.to_str())["model"]

    vocab = {token: i for i, token in enumerate(GEMMA_SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):  # merge order kept
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
    )
    fast.chat_template = _gemma3_template()
    return fast


def _save_gemma3(path: Path) -> Path:
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    tokenizer = gemma_tokenizer()
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer) + 8,  # a few unused rows, as real checkpoints have
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4,
        max_position_embeddings=256,
        initializer_range=0.1,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model = Gemma3ForCausalLM(config)
    _randomise(model, 0.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_qwen3(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_gemma3(tmp_path_factory.mktemp("gemma3") / "model")


@pytest.fixture(params=["qwen3", "gemma3"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


def _field(path: Path, key: str) -> Any:
    import gguf
    from transformers.modeling_gguf_pytorch_utils import read_field

    values = read_field(gguf.GGUFReader(str(path)), key)
    return values[0] if len(values) == 1 else values


def _encode(model_dir: Path, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(out["input_ids"])


def _reference_logits(model_dir: Path, quant: str, ids: list[int]) -> Any:
    """The Hugging Face model's logits, its weights rounded through the GGML types the exporter gives them."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from flowrl.export.gguf_arch import arch_spec
    from flowrl.export.gguf_writer import read_config
    from flowrl.export.quantize import plan_tensor

    config = read_config(model_dir)
    _, spec = arch_spec(config)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.gguf_arch)
    name_map = gguf.get_tensor_name_map(arch, int(config["num_hidden_layers"]))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
            ggml_type = plan_tensor(gguf_name or name, tuple(param.shape), quant).ggml_type
            array = param.numpy()
            if ggml_type == "F16":
                param.copy_(torch.from_numpy(array.astype("float16").astype("float32")))
            elif ggml_type != "F32":
                qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
                rounded = gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype)
                param.copy_(torch.from_numpy(rounded.reshape(array.shape)))
        return model(torch.tensor([ids])).logits[0].numpy()


def _llama_cpp_logits(path: Path, ids: list[int]) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=256, n_threads=2, verbose=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


# Bounds on max |logit difference| between llama.cpp and the quantisation-simulated HF model. llama.cpp rounds
# activations too (F16 for F16 weights, Q8 for block types), so the block types get more room; a wrong transform
# moves the logits by whole units (see test_a_forgotten_transform_is_caught).
LLAMA_CPP_MAX_DIFF = {"f16": 0.05, "q8_0": 0.25, "q4_0": 0.25}


@pytest.mark.parametrize("quant", ["f16", "q8_0", "q4_0"])
def test_transformers_reloads_with_matching_logits(model_dir: Path, tmp_path: Path, quant: str) -> None:
    out = tmp_path / f"model-{quant}.gguf"
    GGUFExporter(quant).export(model_dir, out)
    report = verify_gguf(out, model_dir, quant, prompts=PROMPTS)
    assert report.passed, report.failures
    assert all(c.conversion_rel_error < 1e-3 for c in report.checks), report.summary()
    assert all(c.tokens_match for c in report.checks)


@pytest.mark.parametrize("quant", ["f16", "q8_0", "q4_0"])
def test_llama_cpp_logits_match(model_dir: Path, tmp_path: Path, quant: str) -> None:
    pytest.importorskip("llama_cpp")
    import numpy as np

    out = tmp_path / f"model-{quant}.gguf"
    GGUFExporter(quant).export(model_dir, out)
    for prompt in PROMPTS:
        ids = _encode(model_dir, prompt)
        got, want = _llama_cpp_logits(out, ids), _reference_logits(model_dir, quant, ids)
        assert got.shape == want.shape
        diff = float(abs(got - want).max())
        assert diff < LLAMA_CPP_MAX_DIFF[quant], f"{prompt!r}: max |Δlogit| {diff:.4f} ({len(ids)} tokens)"
        # F16: every position's top-1 agrees. Block types: llama.cpp's Q8 activations may swap near-ties, so every
        # position whose top-2 margin exceeds twice the bound must agree.
        top2 = np.sort(want, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0] > 2 * LLAMA_CPP_MAX_DIFF[quant]) | (quant == "f16")
        agree = got.argmax(-1) == want.argmax(-1)
        assert agree[clear].all(), f"{prompt!r}: top-1 differs at {(~agree).nonzero()[0].tolist()} ({diff=:.4f})"


def test_llama_cpp_tokenizes_like_transformers(model_dir: Path, tmp_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    from transformers import AutoTokenizer

    out = tmp_path / "model.gguf"
    GGUFExporter("q8_0").export(model_dir, out)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    try:
        chat = tok.apply_chat_template(
            [{"role": "user", "content": TEXTS[0]}], add_generation_prompt=True, tokenize=False
        )
        for text in (*TEXTS, chat):
            want = tok(text, add_special_tokens=False)["input_ids"]
            assert llm.tokenize(text.encode(), add_bos=False, special=True) == want, text
    finally:
        llm.close()


@pytest.mark.parametrize(
    "arch,hf_arch,broken",
    [("gemma3", "Gemma3ForCausalLM", {"norm_shift": 0.0}), ("qwen3", "Qwen3ForCausalLM", {"permute_qk": True})],
)
def test_a_wrong_transform_is_caught(
    arch: str, hf_arch: str, broken: dict, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch
) -> None:
    """Gemma without the +1 on its norms, Qwen3 with Llama's Q/K permutation: both checks fail loudly."""
    import dataclasses

    import flowrl.export.gguf_arch as ga

    source = request.getfixturevalue(f"{arch}_dir")
    monkeypatch.setitem(ga.ARCHITECTURES, hf_arch, dataclasses.replace(ga.ARCHITECTURES[hf_arch], **broken))
    out = tmp_path / "broken.gguf"
    GGUFExporter("f16").export(source, out)
    with pytest.raises(VerificationError, match="the conversion is wrong"):
        verify_gguf(out, source, "f16", prompts=PROMPTS[:1])
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return
    ids = _encode(source, PROMPTS[0])
    diff = float(abs(_llama_cpp_logits(out, ids) - _reference_logits(source, "f16", ids)).max())
    assert diff > 10 * LLAMA_CPP_MAX_DIFF["f16"], diff


def test_gemma3_metadata_follows_the_converter(gemma3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    result = GGUFExporter("q8_0").export(gemma3_dir, out)
    assert _field(out, "general.architecture") == "gemma3"
    assert _field(out, "gemma3.attention.sliding_window") == 4
    assert _field(out, "gemma3.attention.key_length") == 256
    assert _field(out, "gemma3.attention.value_length") == 256
    assert _field(out, "gemma3.rope.freq_base") == pytest.approx(1_000_000.0)
    assert _field(out, "gemma3.rope.freq_base_swa") == pytest.approx(10_000.0)
    assert "output.weight" not in result.tensor_types  # tied: llama.cpp reuses token_embd
    assert result.tensor_types["blk.0.attn_q_norm.weight"] == "F32"
    assert result.tensor_types["blk.0.post_ffw_norm.weight"] == "F32"
    assert not result.warnings, result.warnings
    assert _field(out, "tokenizer.ggml.model") == "llama"
    assert _field(out, "tokenizer.ggml.add_space_prefix") is False
    assert _field(out, "tokenizer.ggml.add_bos_token") is True
    tokens = _field(out, "tokenizer.ggml.tokens")
    types = _field(out, "tokenizer.ggml.token_type")
    assert tokens[_field(out, "tokenizer.ggml.bos_token_id")] == "<bos>"
    assert tokens[_field(out, "tokenizer.ggml.eot_token_id")] == "<end_of_turn>"
    assert tokens[10] == "<0x04>" and types[10] == 6  # BYTE
    assert types[tokens.index("<start_of_turn>")] == 3  # CONTROL
    assert tokens[-1].startswith("[PAD") and types[-1] == 5  # rows beyond the tokenizer: UNUSED
    assert "<start_of_turn>" in _field(out, "tokenizer.chat_template")


def test_gemma3_warns_about_what_llama_cpp_hard_codes(gemma3_dir: Path, tmp_path: Path) -> None:
    config = json.loads((gemma3_dir / "config.json").read_text())
    config["query_pre_attn_scalar"] = 64
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    odd = tmp_path / "odd"
    odd.mkdir()
    for f in gemma3_dir.iterdir():
        (odd / f.name).write_bytes(f.read_bytes())
    (odd / "config.json").write_text(json.dumps(config))
    result = GGUFExporter("f16").export(odd, tmp_path / "m.gguf")
    joined = " ".join(result.warnings)
    assert "query_pre_attn_scalar" in joined and "every 6th layer" in joined


def test_qwen3_metadata_and_qk_norms(qwen3_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    result = GGUFExporter("q4_0").export(qwen3_dir, out)
    assert _field(out, "general.architecture") == "qwen3"
    assert result.tensor_types["blk.1.attn_q_norm.weight"] == "F32"
    assert result.tensor_types["blk.1.attn_k_norm.weight"] == "F32"
    assert _field(out, "qwen3.attention.key_length") == 128  # != hidden / heads
    assert _field(out, "tokenizer.ggml.pre") == "smollm"


def test_vocab_through_special_vocab(qwen3_dir: Path, tmp_path: Path) -> None:
    """Special ids, merges and chat template come from gguf.SpecialVocab; flowrl adds EOT and add_bos/add_eos."""
    import gguf
    from transformers import AutoTokenizer

    from flowrl.export.vocab import special_vocab

    tok = AutoTokenizer.from_pretrained(str(qwen3_dir))
    special = special_vocab(tok, qwen3_dir, 320)
    plain = gguf.SpecialVocab(qwen3_dir, load_merges=True, n_vocab=320)
    assert special.special_token_ids == {**plain.special_token_ids, "eot": 2}
    assert special.special_token_ids["bos"] == tok.convert_tokens_to_ids("<|im_start|>")
    assert special.special_token_ids["eos"] == tok.convert_tokens_to_ids("<|im_end|>")
    assert special.add_special_token == {"bos": False, "eos": False}  # what the tokenizer does; no file says
    merges = json.loads((qwen3_dir / "tokenizer.json").read_text())["model"]["merges"]
    assert len(special.merges) == len(merges) > 0

    out = tmp_path / "m.gguf"
    GGUFExporter("f16").export(qwen3_dir, out)
    assert len(_field(out, "tokenizer.ggml.merges")) == len(merges)
    assert _field(out, "tokenizer.ggml.padding_token_id") == 2
    assert _field(out, "tokenizer.ggml.unknown_token_id") == tok.convert_tokens_to_ids("<|endoftext|>")
    assert _field(out, "tokenizer.chat_template") == tok.chat_template
