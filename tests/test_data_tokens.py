"""Token sequences and loss masks: captured ids used exactly, merged Agent Lightning's way; template rows masked
to the tokens generated in the run (never system, user, tool output or few-shot turns), end-of-turn included."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")

from helpers_tiny_model import tiny_tokenizer  # noqa: E402

from flowrl.data.encode import EncodeStats, encode_for_trl, row_sequences  # noqa: E402
from flowrl.data.tokens import CallTokens, ChatRenderer, TemplateError, aligned_calls, merge_calls  # noqa: E402
from flowrl.trace.schema import ExecutionTrace  # noqa: E402

FEW_SHOT = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "FEWSHOT-ANSWER 5"},
    {"role": "user", "content": "What is 12 * 7?"},
]
RUN = [
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "exec_code", "arguments": {"code": "print(12 * 7)"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "exec_code", "content": "TOOLOUT 84"},
    {"role": "assistant", "content": "The answer is 84."},
]


@pytest.fixture(scope="module")
def tok() -> Any:
    return tiny_tokenizer(["FEWSHOT-ANSWER", "TOOLOUT"])


def _trained(tok: Any, ids: list[int], mask: list[int]) -> str:
    return tok.decode([t for t, m in zip(ids, mask) if m])


def test_merge_extends_only_where_the_next_prompt_starts_with_the_sequence() -> None:
    a = CallTokens([1, 2, 3], [4, 5], [-0.1, -0.2], "t@x")
    b = CallTokens([1, 2, 3, 4, 5, 6, 7], [8, 9], [-0.3, -0.4], "t@x")
    (seq,) = merge_calls([a, b])
    assert seq.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert seq.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert seq.logprobs == [None, None, None, -0.1, -0.2, None, None, -0.3, -0.4]
    drifted = CallTokens([1, 2, 3, 4, 99, 6], [8], None, "t@x")  # the history was re-tokenized differently
    first, second = merge_calls([a, drifted])
    assert first.input_ids == [1, 2, 3, 4, 5] and second.input_ids == [1, 2, 3, 4, 99, 6, 8]
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1]


def test_template_sft_trains_only_this_runs_assistant_tokens(tok: Any) -> None:
    renderer = ChatRenderer(tok)
    seq = renderer.render(FEW_SHOT + RUN, train_from=len(FEW_SHOT))
    trained = _trained(tok, seq.input_ids, seq.loss_mask)
    assert "exec_code" in trained and "The answer is 84." in trained
    for context in ("calculator agent", "What is", "FEWSHOT-ANSWER", "TOOLOUT", "<|im_start|>"):
        assert context not in trained
    assert trained.count("<|im_end|>") == 2  # each turn learns to stop
    assert tok.decode(seq.input_ids) == tok.apply_chat_template(FEW_SHOT + RUN, tokenize=False)


def test_kto_and_dpo_rows_end_on_the_end_of_turn_token(tok: Any) -> None:
    renderer = ChatRenderer(tok)
    prompt, completion = FEW_SHOT + RUN[:2], RUN[2:]
    p, c, mask = renderer.prompt_completion(prompt, completion)
    assert tok.decode(c) == "The answer is 84.<|im_end|>" and set(mask) == {1}
    assert tok.decode(p).endswith("<|im_start|>assistant\n")
    rows, stats = encode_for_trl(
        "dpo",
        [{"prompt": prompt, "chosen": completion, "rejected": [{"role": "assistant", "content": "83"}]}],
        renderer,
        max_length=None,
    )
    assert tok.decode(rows[0]["rejected_ids"]) == "83<|im_end|>" and stats.sources["template"] == 1


def test_captured_ids_are_used_exactly_when_the_tokenizer_matches(tok: Any) -> None:
    renderer = ChatRenderer(tok)
    call = {
        "prompt_ids": [5, 6, 7],
        "completion_ids": [8, tok.eos_token_id],
        "logprobs": None,
        "tokenizer": renderer.fingerprint,
    }
    row = {"messages": FEW_SHOT + RUN, "prompt_end": len(FEW_SHOT), "captured": {"calls": [call]}}
    (seq,) = row_sequences("sft", row, renderer, EncodeStats())
    assert seq.input_ids == [5, 6, 7, 8, tok.eos_token_id] and seq.loss_mask == [0, 0, 0, 1, 1]
    stats = EncodeStats(render=renderer.stats)
    other = {**row, "captured": {"calls": [{**call, "tokenizer": "other@0000"}]}}
    (seq,) = row_sequences("sft", other, renderer, stats)
    assert seq.source == "template" and stats.render.counts["captured ids of another tokenizer"] == 1


def test_a_run_with_a_redacted_call_is_not_token_faithful() -> None:
    calls = [
        {"prompt_token_ids": [1, 2], "token_ids": [3], "tokenizer": "t@x"},
        {"prompt_token_ids": None, "token_ids": None, "token_ids_dropped": "redacted"},
    ]
    trace = ExecutionTrace(llm_calls=calls)
    assert aligned_calls(trace, 2) is None
    trace = ExecutionTrace(llm_calls=calls[:1])
    assert aligned_calls(trace, 1) is not None and aligned_calls(trace, 2) is None


def test_a_template_that_drops_tool_calls_gets_them_as_text_and_says_so(tok: Any) -> None:
    plain = tiny_tokenizer(["FEWSHOT-ANSWER", "TOOLOUT"])
    plain.chat_template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    renderer = ChatRenderer(plain)
    assert not renderer.renders_tool_calls
    seq = renderer.render(FEW_SHOT + RUN, train_from=len(FEW_SHOT))
    assert '<tool_call>{"name": "exec_code"' in _trained(plain, seq.input_ids, seq.loss_mask)
    assert renderer.stats.counts["tool calls written as text"] == 1


def test_a_template_that_is_not_prefix_preserving_and_has_no_training_version_stops(tok: Any) -> None:
    odd = tiny_tokenizer()
    # renders the last message differently from earlier ones: not prefix-preserving, unknown to TRL
    odd.chat_template = (
        "{%- for m in messages %}{%- if loop.last %}{{- 'LAST:' }}{%- endif %}"
        "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    renderer = ChatRenderer(odd, model="my/odd-model")
    with pytest.raises(TemplateError, match="my/odd-model is not prefix-preserving.*capture token ids"):
        renderer.render(FEW_SHOT + RUN[2:], train_from=len(FEW_SHOT))


def test_over_long_rows_are_dropped_and_counted_not_cut(tok: Any) -> None:
    renderer = ChatRenderer(tok)
    rows, stats = encode_for_trl(
        "sft", [{"messages": FEW_SHOT + RUN, "prompt_end": len(FEW_SHOT)}], renderer, max_length=10
    )
    assert rows == [] and stats.dropped == {"longer than max_length 10": 1}


def test_a_build_over_the_token_budget_lists_each_dropped_row(tmp_path: Any, tok: Any) -> None:
    """Issue 21: rows are measured in the target model's tokens; each dropped row is in the card and metadata."""
    import json

    from flowrl.data import DatasetPipeline, KTODatasetBuilder
    from flowrl.data.encode import TokenBudget

    traces = [
        ExecutionTrace(
            trace_id=f"t{i}",
            user_query=f"q{i}",
            label=True,
            reward_score=0.9,
            messages=[
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": "long answer " * (40 if i == 1 else 1)},
            ],
        )
        for i in range(3)
    ]
    budget = TokenBudget("kto", ChatRenderer(tok, model="tiny"), max_length=60)
    result = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.0, budget=budget).build(traces, tmp_path / "ds")
    assert result.counts == {"train": 2}
    meta = json.loads((tmp_path / "ds" / "flowrl_dataset.json").read_text())
    (dropped,) = meta["stats"]["dropped_rows"]
    assert dropped["trace_ids"] == ["t1"] and dropped["tokens"] > 60
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "Token budget: 60 tokens of `tiny`" in card and "| train | t1 |" in card
    assert any("1 rows over it dropped" in line for line in result.summary_lines())


def test_the_run_record_lists_rows_dropped_at_training(tok: Any) -> None:
    renderer = ChatRenderer(tok)
    rows = [
        {"trace_id": "short", "messages": FEW_SHOT + RUN[2:], "prompt_end": len(FEW_SHOT)},
        {
            "trace_id": "long",
            "messages": FEW_SHOT + [{"role": "assistant", "content": "x " * 300}],
            "prompt_end": len(FEW_SHOT),
        },
    ]
    out, stats = encode_for_trl("sft", rows, renderer, max_length=200)
    assert len(out) == 1 and stats.to_dict()["dropped_rows"][0]["trace_ids"] == ["long"]


def test_a_registered_method_is_encoded_by_its_spec(tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flowrl dataset show` and `build-dataset --max-length` encode by the method's `encoding` (issue 35: a new
    method registered as the method table's docstring shows failed with `no encoding for method 'orpo'`)."""
    from flowrl.methods import METHODS, MethodSpec, register_method

    monkeypatch.setitem(METHODS, "orpo", METHODS["dpo"])  # restored after the test
    register_method(
        MethodSpec("orpo", "flowrl.data.dpo:DPODatasetBuilder", "ORPOConfig", "ORPOTrainer", (("chosen",),), 5e-5,
                   "preference pairs for ORPO", encoding="dpo", trl_module="trl.experimental.orpo")
    )  # fmt: skip
    renderer = ChatRenderer(tok)
    row = {
        "prompt": [{"role": "user", "content": "q"}],
        "chosen": [{"role": "assistant", "content": "good"}],
        "rejected": [{"role": "assistant", "content": "bad"}],
    }
    orpo = row_sequences("orpo", row, renderer, EncodeStats())
    dpo = row_sequences("dpo", row, renderer, EncodeStats())
    assert [s.input_ids for s in orpo] == [s.input_ids for s in dpo] and len(orpo) == 2
