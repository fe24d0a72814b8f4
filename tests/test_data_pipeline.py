"""Building to disk: layout, JSONL = Arrow rows, metadata, card, overwrite, the CLI, the fixture store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowrl.cli import main
from flowrl.data import METADATA_FILE, DatasetPipeline, KTODatasetBuilder, SFTDatasetBuilder
from flowrl.data.synthetic import write_synthetic_store
from flowrl.store.files import TraceStore

RL_TRACES = Path(__file__).parent / "fixtures" / "flowagent-0.1.28" / "rendering" / "rl_traces"


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    return TraceStore(write_synthetic_store(tmp_path / "store", 300, n_tasks=30))


def test_build_writes_datasetdict_jsonl_card_and_metadata(store: TraceStore, tmp_path: Path) -> None:
    import datasets

    out = tmp_path / "out"
    result = DatasetPipeline(KTODatasetBuilder(), val_fraction=0.2).build(store, out, parquet=True)
    dd = datasets.load_from_disk(str(out))
    assert set(dd) == {"train", "validation"} and result.counts == {k: len(v) for k, v in dd.items()}
    for split, ds in dd.items():
        lines = (out / "data" / f"{split}.jsonl").read_text().splitlines()
        assert [json.loads(line)["trace_id"] for line in lines] == ds["trace_id"]  # same rows, same order
        assert json.loads(lines[0])["prompt"] == ds[0]["prompt"]
        assert datasets.Dataset.from_parquet(str(out / "data" / f"{split}.parquet"))[0]["prompt"] == ds[0]["prompt"]
    meta = json.loads((out / METADATA_FILE).read_text())
    for key in ("method", "counts", "desirable_weight", "undesirable_weight", "splits", "filters", "flowrl_version"):
        assert key in meta
    assert meta["method"] == "kto" and meta["counts"] == result.counts and meta["desirable_weight"] >= 1.0
    card = (out / "README.md").read_text()
    for text in (
        "# flowrl kto dataset",
        "| train |",
        "desirable (true)",
        "Reward histogram",
        "desirable_weight=",
        "flowrl 0.1.0",
        "Filters:",
        "rows dropped as too long: 0",
    ):
        assert text in card, text
    assert not (out / ".flowrl-build").exists()


def test_out_folder_is_not_clobbered(store: TraceStore, tmp_path: Path) -> None:
    out = tmp_path / "out"
    DatasetPipeline(SFTDatasetBuilder()).build(store, out)
    from flowrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--overwrite"):
        DatasetPipeline(SFTDatasetBuilder()).build(store, out)
    DatasetPipeline(SFTDatasetBuilder(select="best")).build(store, out, overwrite=True)
    (out / "mine.txt").write_text("x")
    with pytest.raises(ConfigError, match="other files"):
        DatasetPipeline(SFTDatasetBuilder()).build(store, out, overwrite=True)


def test_unreadable_files_are_skipped_and_counted(store: TraceStore, tmp_path: Path) -> None:
    day = next(p for p in store.root.iterdir() if p.is_dir())
    (day / "broken.json").write_text("{not json")
    result = DatasetPipeline(KTODatasetBuilder()).build(store, tmp_path / "out")
    assert result.stats.unreadable == 1 and any("broken.json" in p.message for p in result.problems)


def test_progress_is_reported(store: TraceStore, tmp_path: Path) -> None:
    seen: list[tuple[str, int, int | None]] = []
    DatasetPipeline(KTODatasetBuilder()).build(store, tmp_path / "out", on_progress=lambda *a: seen.append(a))
    assert ("read", 300, 300) in seen and seen[-1][0] == "write" and seen[-1][1] == seen[-1][2]


@pytest.mark.parametrize("method", ["kto", "grpo", "grpo-offline", "sft", "dpo"])
def test_cli_build_dataset_each_method(
    store: TraceStore, tmp_path: Path, method: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / method
    assert main(["build-dataset", "--method", method, "--store", str(store.root), "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert f"{method} dataset:" in printed and str(out) in printed
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["method"] == method and sum(meta["counts"].values()) > 0


def test_cli_errors_are_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        main(
            ["build-dataset", "-m", "kto", "--store", str(empty), "--out", str(tmp_path / "o"), "--since", "2026-01-01"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"no traces under {empty}" in err and "since=2026-01-01" in err
    assert (
        main(["build-dataset", "-m", "sft", "--store", str(empty), "--out", str(tmp_path / "o"), "--threshold", "0.5"])
        == 2
    )
    assert "--threshold does not apply to --method sft" in capsys.readouterr().err
    assert main(["build-dataset", "-m", "ppo", "--store", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "method 'ppo'" in capsys.readouterr().err


def test_cli_on_the_flowagent_rl_traces_fixture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """toolboxv2 rl_traces files have no messages and no rewards: labels are set by hand first."""
    store_dir = tmp_path / "s"
    shutil.copytree(RL_TRACES, store_dir)
    st = TraceStore(store_dir)
    st.label("0498911e921f", True)
    st.label("2a86d8ba994f", False)
    out = tmp_path / "kto"
    assert (
        main(
            [
                "build-dataset",
                "--method",
                "kto",
                "--store",
                str(store_dir),
                "--out",
                str(out),
                "--val-fraction",
                "0",
                "--kto-rows",
                "final",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "2 train rows" in printed and "skipped 1 traces: unlabelled" in printed
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["stats"]["synthesized_conversations"] == 3 and meta["stats"]["label_sources"] == {"manual": 2}
