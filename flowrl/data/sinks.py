"""Where built rows go: a list per split in memory, or spool files on disk turned into the outputs.

The disk sink appends each row as one JSON line to a spool file per split (remembering where each line
starts, 8 bytes a row), so a build holds no rows in memory. `finish` reads the lines back, in a seeded
random order for splits that must be shuffled, and writes in one pass the final JSONL and the Arrow
file behind the `datasets.Dataset`, a batch at a time.
"""

from __future__ import annotations

import os
import random
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

WRITE_BATCH = 1000


def _dumps(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS, default=str)


def ordered(n: int, shuffle: bool, seed: int) -> list[int]:
    order = list(range(n))
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


class MemorySink:
    """Rows kept in lists, for `DatasetPipeline.to_dataset_dict`."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, split: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(split, []).append(row)

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.rows.items()}

    def dataset_dict(self, features: Any, shuffle: set[str], seed: int) -> Any:
        from datasets import Dataset, DatasetDict

        out = {}
        for split, rows in self.rows.items():
            rows = [rows[i] for i in ordered(len(rows), split in shuffle, seed)]
            out[split] = Dataset.from_list(rows, features=features)
        return DatasetDict(out)

    def close(self) -> None:
        self.rows.clear()


class DiskSink:
    """Rows spooled to `{tmp}/{split}.spool`; `finish` writes JSONL, Arrow and (on request) Parquet."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, IO[bytes]] = {}
        self._offsets: dict[str, array] = {}
        self._pos: dict[str, int] = {}

    def add(self, split: str, row: dict[str, Any]) -> None:
        fh = self._files.get(split)
        if fh is None:
            fh = self._files[split] = open(self.tmp / f"{split}.spool", "wb")  # noqa: SIM115 - closed in close()
            self._offsets[split] = array("q")
            self._pos[split] = 0
        line = _dumps(row)
        self._offsets[split].append(self._pos[split])
        self._pos[split] += len(line)
        fh.write(line)

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._offsets.items()}

    def finish(
        self,
        out: Path,
        features: Any,
        shuffle: set[str],
        seed: int,
        *,
        parquet: bool = False,
        on_progress: Callable[[str, int, int | None], None] | None = None,
    ) -> dict[str, Path]:
        """Write `out/data/{split}.jsonl`, the Arrow datasets (returned by split) and Parquet on request."""
        from datasets.arrow_writer import ArrowWriter

        for fh in self._files.values():
            fh.close()
        data = out / "data"
        data.mkdir(parents=True, exist_ok=True)
        arrows: dict[str, Path] = {}
        total = sum(self.counts().values())
        done = 0
        for split, offsets in self._offsets.items():
            spool = self.tmp / f"{split}.spool"
            ends = array("q", offsets[1:]) + array("q", [self._pos[split]])
            arrows[split] = self.tmp / f"{split}.arrow"
            with (
                open(spool, "rb") as src,
                open(data / f"{split}.jsonl", "wb") as jsonl,
                ArrowWriter(features=features, path=str(arrows[split]), writer_batch_size=WRITE_BATCH) as writer,
            ):
                batch: list[bytes] = []
                fd = src.fileno()
                for i in ordered(len(offsets), split in shuffle, seed):
                    line = os.pread(fd, ends[i] - offsets[i], offsets[i])
                    jsonl.write(line)
                    batch.append(line)
                    if len(batch) == WRITE_BATCH:
                        writer.write_table(_table(batch, features))
                        done += len(batch)
                        batch = []
                        if on_progress:
                            on_progress("write", done, total)
                if batch:
                    writer.write_table(_table(batch, features))
                    done += len(batch)
                writer.finalize()
            spool.unlink()
            if on_progress:
                on_progress("write", done, total)
        return arrows

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()


def _table(lines: list[bytes], features: Any) -> Any:
    """An Arrow table of JSON lines, built column by column (datasets' per-value encoding is 5x slower)."""
    import pyarrow as pa

    rows = [orjson.loads(line) for line in lines]
    return pa.table({name: _arrow([row.get(name) for row in rows], feature) for name, feature in features.items()})


def _arrow(values: list[Any], feature: Any) -> Any:
    """Arrow array of `values` for the feature types the builders use: Value, Json and List of those."""
    import pyarrow as pa
    from datasets import Json, List

    if isinstance(feature, Json):
        return pa.array([None if v is None else orjson.dumps(v, default=str).decode() for v in values], type=pa.json_())
    if isinstance(feature, List):
        offsets: list[int] = [0]
        flat: list[Any] = []
        mask: list[bool] = []
        for v in values:
            mask.append(v is None)
            flat.extend(v or ())
            offsets.append(len(flat))
        child = _arrow(flat, feature.feature)
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), child, mask=pa.array(mask) if any(mask) else None
        )
    return pa.array(values, type=feature.pa_type)
