"""Which model `--model` / `--base-model` means (issue 22): a folder, a mistyped path, or a Hub id asked once.

No test here reaches the network: every socket connect fails at once, and the Hub's `model_info` is a fake, so
a code path that still tried the Hub shows up as a failed (slow or wrong) test, never as a hang.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import RepositoryNotFoundError

from flowrl.cli import main
from flowrl.errors import ModelError
from flowrl.models import hub_offline, looks_like_path, resolve_model


class _NoSuchRepo(RepositoryNotFoundError):
    def __init__(self) -> None:  # the real one wants an HTTP response
        Exception.__init__(self, "404 Client Error: Repository Not Found")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Online as far as huggingface_hub knows, but no socket connects and `model_info` records its calls."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("network blocked in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # restored after each test, whatever the code set
    calls: list[str] = []

    def unreachable(repo_id: str, **kwargs: Any) -> Any:
        calls.append(repo_id)
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    return calls


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2 + 2?", "reference_answer": "4"}) + "\n")
    return path


@pytest.mark.parametrize(
    "spec", ["runs/nope", "./nope", "../nope", "~/flowrl-no-such-model", "/no/such/model", "runs/a/b"]
)
def test_a_missing_path_is_one_clear_error_at_once(spec: str, _no_network: list[str]) -> None:
    started = time.perf_counter()
    with pytest.raises(ModelError, match="does not exist") as info:
        resolve_model(spec)
    assert time.perf_counter() - started < 10.0  # at once: no download (room for a loaded machine)
    assert spec in str(info.value) and "\n" not in str(info.value)
    assert _no_network == []  # the Hub was never asked


def test_what_counts_as_a_path(tmp_path: Path) -> None:
    assert looks_like_path("runs/nope")  # runs/ exists in the test's working folder
    assert looks_like_path("./x") and looks_like_path("~/x") and looks_like_path("a/b/c")
    assert not looks_like_path("someone/model")  # no folder someone/: a Hub id
    assert not looks_like_path("gpt2")


def test_an_existing_folder_is_loaded_from_it(tmp_path: Path, _no_network: list[str]) -> None:
    (tmp_path / "runs" / "model").mkdir()
    (tmp_path / "runs" / "model" / "config.json").write_text("{}")
    assert resolve_model("runs/model").path == "runs/model"
    assert _no_network == []


def test_an_unknown_hub_id_is_asked_once_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def missing(repo_id: str, **kwargs: Any) -> Any:
        calls.append({"repo_id": repo_id, **kwargs})
        raise _NoSuchRepo()

    monkeypatch.setattr(huggingface_hub, "model_info", missing)
    started = time.perf_counter()
    with pytest.raises(ModelError, match="someone/nonexistent-model") as info:
        resolve_model("someone/nonexistent-model")
    assert time.perf_counter() - started < 10.0  # at once: no download (room for a loaded machine)
    assert "\n" not in str(info.value) and "Hugging Face Hub" in str(info.value)
    assert len(calls) == 1 and calls[0]["timeout"] <= 10  # one short request, no retries


def test_an_invalid_hub_id_is_refused_without_a_request(_no_network: list[str]) -> None:
    with pytest.raises(ModelError, match="neither an existing folder nor a valid Hugging Face Hub id"):
        resolve_model("no such model")
    assert _no_network == []


def test_an_unreachable_hub_is_probed_once_then_the_process_is_offline(
    _no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hub id the local cache holds is loaded from it; one it does not hold is one line at once (it failed only
    when the model was loaded, after the training stack was imported: 4.7 s and two lines from `flowrl eval`)."""
    pytest.importorskip("transformers")
    import huggingface_hub

    cached = {"someone/cached-model"}
    monkeypatch.setattr(
        huggingface_hub,
        "try_to_load_from_cache",
        lambda repo, name, **_: f"/cache/{repo}/{name}" if repo in cached and name == "config.json" else None,
    )
    started = time.perf_counter()
    with pytest.raises(ModelError, match="someone/nonexistent-model") as info:
        resolve_model("someone/nonexistent-model")
    assert "not in the local Hugging Face cache" in str(info.value) and "\n" not in str(info.value)
    assert not hub_offline()  # nothing to load from the cache: no switch, no warning
    resolved = resolve_model("someone/cached-model")
    assert resolved.path == "someone/cached-model" and hub_offline()
    with pytest.raises(ModelError, match="someone/other-model"):
        resolve_model("someone/other-model")  # offline now: no second request
    assert _no_network == ["someone/nonexistent-model", "someone/cached-model"]
    assert time.perf_counter() - started < 10.0


def test_eval_cli_with_a_mistyped_model_folder_says_one_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], _no_network: list[str]
) -> None:
    prompts = _prompts(tmp_path)
    started = time.perf_counter()
    assert main(["eval", "--model", "runs/nope", "--prompts", str(prompts)]) == 2
    assert time.perf_counter() - started < 10.0  # at once: no download (room for a loaded machine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs/nope" in err[0] and "does not exist" in err[0]
    assert _no_network == []


def test_eval_cli_with_a_mistyped_folder_whose_parent_does_not_exist_says_one_line_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], _no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs/nope` where there is no `runs/` reads as a Hub id: offline, one line before any heavy import."""
    prompts = _prompts(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    started = time.perf_counter()
    assert main(["eval", "--model", "runs/nope", "--prompts", str(prompts)]) == 2
    assert time.perf_counter() - started < 10.0  # at once: no download (room for a loaded machine)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs/nope" in err[0] and "no such folder" in err[0]


def test_eval_cli_with_an_unknown_hub_id_says_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    started = time.perf_counter()
    assert main(["eval", "--model", "someone/nonexistent-model", "--prompts", str(_prompts(tmp_path))]) == 2
    assert time.perf_counter() - started < 10.0  # imports torch and transformers; no request after the probe
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("flowrl: error")]
    assert len(err) == 1 and "someone/nonexistent-model" in err[0]


def test_train_cli_with_a_mistyped_base_model_folder_fails_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], _no_network: list[str]
) -> None:
    pytest.importorskip("trl")
    (tmp_path / "models").mkdir()
    started = time.perf_counter()
    rc = main(
        [
            "train",
            "--method",
            "sft",
            "--dataset",
            str(_prompts(tmp_path)),
            "--base-model",
            "models/nope",
            "--output-dir",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 2 and time.perf_counter() - started < 10.0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "models/nope" in err[0] and "does not exist" in err[0]
    assert _no_network == []
