"""SideView: every side record of a store (`flowrl.store.segments.sidecar`), held compactly and found by trace id.

A listing holds every side record of its store, and a scored store has one per trace. As Python objects (a
`Record` with its line, a list and a dict entry per id) that was ~0.9 KB a trace: 1.2 GiB in the main process of a
build from a million scored traces. Here a record is a row of fixed-size arrays (when, which line, which kind,
where its line is, a second hash of its id, what a plain patch sets: 38 bytes, and 12 more in the sorted index),
and the lines are kept zstd-compressed in runs of whole lines (`RUN_BYTES`, 13-21 bytes a score patch). Reading a
record decompresses its run (~25 µs for 32 KB); the last few runs stay decompressed, so reading traces in about
the order they were scored mostly finds them there.

Records are found by their trace id's `hash` (a sorted numpy index; what was added since it was sorted is in a
small dict until the next sort). Each record found is parsed and its id compared, so two ids with one hash
never mix; `mask` answers "may have records" for many ids at once, where such a collision only sends a row the
careful way; `plain_records` takes a record as the id's without reading its line when a second, independent hash
(`_check`) agrees too. This process's records not yet put are held as `Record`s until `settle` swaps them for the
object that holds them, read back as any other.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import numpy as np
import orjson

from flowrl.store.segments import plain, sidecar
from flowrl.store.segments.sidecar import Record, Skip, tell
from flowrl.trace.outcomes import HostOutcome
from flowrl.trace.schema import ExecutionTrace

RUN_BYTES = 32 * 1024
_CACHED_RUNS = 8
_PATCH, _OUTCOME, _MANUAL, _PLAIN, _SCORE, _REWARDS = 1, 2, 4, 8, 16, 32  # a record's flags (PLAIN: `plain`)
_KIND_BITS = {"patch": _PATCH, "outcome": _OUTCOME}
_SORT_AT = 4096  # records added since the index was sorted: looked up through a dict up to max(this, n / 16)
_key = hash  # of a trace id, in this process (a test makes every id collide)


def _check(trace_id: str) -> int:
    """A second hash of a trace id, independent of `_key`: a record found by `_key` without its line being parsed
    is the id's when both agree (`plain_records`); `hash` is keyed per process, so ids cannot be made to collide."""
    return hash(trace_id + "\x00") & 0xFFFFFFFF


class SideView:
    """Every side record read so far and this process's pending ones, by trace id. Thread-safe."""

    MANUAL, SCORE, REWARDS = _MANUAL, _SCORE, _REWARDS

    def __init__(self) -> None:
        import pyarrow as pa

        self._lock = threading.RLock()
        self._codec = pa.Codec("zstd", compression_level=1)
        self._locations: list[str] = []  # object number -> location
        self._runs: list[bytes] = []  # compressed runs of lines
        self._run_sizes, self._run_object = array("q"), array("i")  # a run's size, and the object it is of
        # one entry per record
        self._at, self._number = array("q"), array("i")  # when, and which line of its object (from 1)
        self._run, self._offset, self._length = array("i"), array("i"), array("i")
        self._flags = array("b")
        self._check = array("I")
        self._hash = array("q")  # of records not yet in the index (`_keys` holds the others')
        self._sets, self._score = array("B"), array("d")  # what a plain patch sets (`plain.codes`)
        # the index: hashes of records [0, len(_order)) sorted, with their record numbers; the rest in `_tail`
        self._keys = np.empty(0, np.int64)
        self._order = np.empty(0, np.int32)
        self._kind_keys = {bit: np.empty(0, np.int64) for bit in _KIND_BITS.values()}
        self._tail: dict[int, list[int]] = {}
        self._tailed = 0  # records [len(_order), _tailed) are in `_tail`
        self._pending: dict[str, list[Record]] = {}
        self._cache: OrderedDict[int, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._at) + sum(map(len, self._pending.values()))

    # -- adding --------------------------------------------------------------------------------------
    def add_object(self, location: str, data: bytes, skip: Skip | None) -> None:
        """The records of one side object; a line that is not one is reported through `skip` and passed over."""
        with self._lock:
            number = len(self._locations)
            self._locations.append(location)
            rows: list[tuple[int, int, int, int, int, int, int, int, float, int]] = []  # as `_per_record`
            run = len(self._runs)
            start = end = 0  # the open run: data[start:end], its lines' records added
            for line_no, offset, line in _lines(data):
                head = _head(line, line_no, location, skip)
                if head is None:
                    continue
                if end > start and offset + len(line) - start > RUN_BYTES:
                    self._close_run(data[start:end], number)
                    start, run = offset, run + 1
                trace_id, at, flags, sets, score = head
                rows.append(
                    (at, _key(trace_id), _check(trace_id), flags, sets, run, offset - start, len(line), score, line_no)
                )
                end = offset + len(line)
            if end > start:
                self._close_run(data[start:end], number)
            if rows:
                for column, values in zip(self._per_record(), zip(*rows, strict=True), strict=True):
                    column.extend(values)

    def _per_record(self) -> tuple[array[Any], ...]:
        """The arrays with an entry per record (`_hash`: per record not yet indexed), as `add_object` fills them."""
        return (
            self._at,
            self._hash,
            self._check,
            self._flags,
            self._sets,
            self._run,
            self._offset,
            self._length,
            self._score,
            self._number,
        )

    def _close_run(self, text: bytes, number: int) -> None:
        self._runs.append(self._codec.compress(text, asbytes=True))
        self._run_sizes.append(len(text))
        self._run_object.append(number)

    def add_pending(self, record: Record) -> None:
        """A record this process holds but has not put yet."""
        with self._lock:
            self._pending.setdefault(record.trace_id, []).append(record)

    def settle(self, records: list[Record], location: str, data: bytes) -> None:
        """`records` (pending) were put as the object at `location` holding `data`: read from there from now on."""
        with self._lock:
            for record in records:
                held = self._pending.get(record.trace_id, [])
                held[:] = [r for r in held if r is not record]
                if not held:
                    self._pending.pop(record.trace_id, None)
            self.add_object(location, data, None)

    # -- finding -------------------------------------------------------------------------------------
    def mask(self, ids: list[str], kind: str | None = None) -> Any:
        """A numpy bool per id: whether it may have records (of `kind`); False means it has none."""
        with self._lock:
            self._sort()
            keys = self._keys if kind is None else self._kind_keys[_KIND_BITS[kind]]
            hashes = np.fromiter(map(_key, ids), np.int64, len(ids))
            if len(keys):
                out = keys[np.minimum(_search(keys, hashes), len(keys) - 1)] == hashes
            else:
                out = np.zeros(len(ids), dtype=bool)
            if self._pending:
                pending = self._pending
                out |= np.fromiter(
                    (any(kind in (None, r.kind) for r in pending.get(tid, ())) for tid in ids), bool, len(ids)
                )
            return out

    def entries(self, trace_id: str) -> list[tuple[Record, dict[str, Any]]]:
        """The records of `trace_id` in merge order (`at`, object, line), each with its body (freshly parsed)."""
        with self._lock:
            out = []
            for i in self._found(_key(trace_id)):
                line = self._line(i)
                obj = orjson.loads(line)
                if obj["trace_id"] != trace_id:  # another id with the same hash
                    continue
                flags = self._flags[i]
                kind = "patch" if flags & _PATCH else "outcome"
                where = (self._locations[self._run_object[self._run[i]]], self._number[i])
                record = Record(self._at[i], where, trace_id, kind, line, bool(flags & _MANUAL))
                out.append((record, obj["fields" if kind == "patch" else "outcome"]))
            out += [(r, r.body) for r in self._pending.get(trace_id, ())]
        out.sort(key=lambda entry: entry[0])
        return out

    def plain_records(self, ids: list[str]) -> Any:
        """For each id whose only record is a plain patch (`flowrl.store.segments.plain`): that record's number, found
        without its line being read (for a segment's rows at once); -1 for the others (no record, several, or
        another kind: merged one by one). A numpy array."""
        with self._lock:
            self._sort()
            keys, order, n = self._keys, self._order, len(ids)
            if not len(keys):
                return np.full(n, -1, dtype=np.int64)
            hashes = np.fromiter(map(_key, ids), np.int64, n)
            lo = np.minimum(_search(keys, hashes), n_keys := len(keys) - 1)
            found = order[lo]
            flags = np.frombuffer(self._flags, dtype=np.int8)[found]
            checks = np.frombuffer(self._check, dtype=np.uint32)[found]
            one = (keys[lo] == hashes) & ((lo == n_keys) | (keys[np.minimum(lo + 1, n_keys)] != hashes))
            ok = one & (flags & (_PATCH | _PLAIN) == _PATCH | _PLAIN)
            ok &= checks == np.fromiter(map(_check, ids), np.uint32, n)
            if self._pending:
                ok &= ~np.fromiter((tid in self._pending for tid in ids), bool, n)
            return np.where(ok, found, -1)

    def columns(self, records: Any) -> tuple[Any, Any, Any]:
        """The flags, `plain.codes` and scores of `records` (numpy arrays; where a record is -1: meaningless)."""
        with self._lock:
            at = np.maximum(records, 0)
            flags = np.frombuffer(self._flags, dtype=np.int8)[at]
            sets = np.frombuffer(self._sets, dtype=np.uint8)[at]
            scores = np.frombuffer(self._score, dtype=np.float64)[at]
            return flags, sets, scores

    def fields(self, record: int) -> dict[str, Any]:
        """A patch's fields, parsed from its line."""
        with self._lock:
            fields: dict[str, Any] = orjson.loads(self._line(record))["fields"]
            return fields

    def apply(self, trace: ExecutionTrace, origin: str, skip: Skip | None) -> ExecutionTrace:
        """`trace` with its records merged (`sidecar.apply`)."""
        return sidecar.apply(trace, self.entries(trace.trace_id), origin, skip)

    def patched_fields(self, trace_id: str, base: dict[str, Any]) -> dict[str, Any] | None:
        """`base` with the trace's patches merged, or None when it must be read whole (`sidecar.patched_fields`)."""
        return sidecar.patched_fields(self.entries(trace_id), base)

    def outcomes(self, trace_id: str, skip: Skip | None) -> list[HostOutcome]:
        return sidecar.outcomes(self.entries(trace_id), skip)

    def _found(self, key: int) -> list[int]:
        """The records whose id hashes to `key`."""
        total = len(self._at)
        if total - len(self._order) > max(_SORT_AT, len(self._order) // 16):
            self._sort()
        indexed = len(self._order)
        for i in range(self._tailed, total):
            self._tail.setdefault(self._hash[i - indexed], []).append(i)
        self._tailed = total
        lo = int(np.searchsorted(self._keys, key))
        hi = lo
        while hi < len(self._keys) and self._keys[hi] == key:
            hi += 1
        return [*self._order[lo:hi].tolist(), *self._tail.get(key, ())]

    def _sort(self) -> None:
        """Sort every record into the index (what `_tail` held too)."""
        if len(self._order) == len(self._at):
            return
        hashes = np.concatenate([self._keys, np.frombuffer(self._hash, dtype=np.int64)])  # (a copy: `array` cannot
        records = np.concatenate([self._order, np.arange(len(self._order), len(self._at), dtype=np.int32)])  # grow
        order = np.argsort(hashes, kind="stable")  # while exported)
        self._keys, self._order, self._hash = hashes[order], records[order], array("q")
        flags = np.frombuffer(self._flags, dtype=np.int8)[self._order]
        self._kind_keys = {}
        for bit in _KIND_BITS.values():  # sorted too; a store of scores only: the same array
            kind = (flags & bit) != 0
            self._kind_keys[bit] = self._keys if kind.all() else self._keys[kind]
        self._tail, self._tailed = {}, len(self._at)

    def _line(self, i: int) -> bytes:
        run = self._run[i]
        text = self._cache.get(run)
        if text is None:
            text = self._codec.decompress(self._runs[run], decompressed_size=self._run_sizes[run], asbytes=True)
            self._cache[run] = text
            if len(self._cache) > _CACHED_RUNS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(run)
        offset = self._offset[i]
        return text[offset : offset + self._length[i]]


def _search(keys: Any, hashes: Any) -> Any:
    """`np.searchsorted(keys, hashes)`, the needles sorted first: a segment's ids hash all over the index, and
    sorted they walk it in one direction (fewer cache misses: `keys` is 8 MB at a million records)."""
    order = np.argsort(hashes)
    out = np.empty(len(hashes), dtype=np.int64)
    out[order] = np.searchsorted(keys, hashes[order])
    return out


def _lines(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """`(number from 1, offset, line)` of each line of `data` as `bytes.splitlines` cuts them (blank ones left out)."""
    offset = 0
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        text = line.rstrip(b"\r\n")
        if text and not text.isspace():
            yield number, offset, text
        offset += len(line)


def _head(line: bytes, line_no: int, location: str, skip: Skip | None) -> tuple[str, int, int, int, float] | None:
    """`(trace_id, at, flags, sets, score)` of a side record's line (the last two: what a plain patch sets, as
    `plain.codes` gives them), or None (said through `skip`) when it is not one."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        tell(skip, location, f"{location} line {line_no}: not JSON, skipped")
        return None
    at = obj.get("at") if isinstance(obj, dict) else None
    if (
        isinstance(obj, dict)
        and isinstance(obj.get("trace_id"), str)
        and isinstance(at, int)
        and -(2**63) <= at < 2**63
    ):
        kind = obj.get("kind")
        fields = obj.get("fields")
        if kind == "patch" and isinstance(fields, dict):
            flags = _PATCH | (_MANUAL if obj.get("manual") else 0)
            sets = plain.codes(fields)
            if sets is None:
                return obj["trace_id"], at, flags, 0, math.nan
            flags |= _PLAIN | (_SCORE if "reward_score" in fields else 0) | (_REWARDS if "rewards" in fields else 0)
            return obj["trace_id"], at, flags, *sets
        if kind == "outcome" and isinstance(obj.get("outcome"), dict):
            return obj["trace_id"], at, _OUTCOME, 0, math.nan
    tell(skip, location, f"{location} line {line_no}: not a side record (patch or outcome), skipped")
    return None


class PatchRewards(Mapping[str, float | None]):
    """A plain patch's `rewards`, read from its record when first used (a build mostly needs only the label)."""

    __slots__ = ("_record", "_value", "_view")

    def __init__(self, view: SideView, record: int) -> None:
        self._view, self._record = view, record
        self._value: dict[str, float | None] | None = None

    def _load(self) -> dict[str, float | None]:
        if self._value is None:
            self._value = plain.float_rewards(self._view.fields(self._record)["rewards"])
        return self._value

    def __getitem__(self, name: str) -> float | None:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def merge_columns(
    view: SideView, ids: list[str], base: Any, exclude: Collection[str] = ()
) -> tuple[Any, dict[str, list[Any]] | None]:
    """Merge plain patches onto `base` (a pyarrow table of the `plain.COLUMNS` of rows with side records, `ids` theirs),
    with numpy, for the rows whose only record is one and not in `exclude`. Returns which rows were merged (numpy
    bools) and every row's `plain.COLUMNS` as lists (a row not merged as it was: merged one by one), or None when none
    was. `rewards` of a merged row whose patch sets them: `PatchRewards`."""
    import numpy as np
    import pyarrow.compute as pc

    records = view.plain_records(ids)
    if exclude:
        records[np.fromiter((tid in exclude for tid in ids), bool, len(ids))] = -1
    merged = records >= 0
    if not merged.any():
        return merged, None
    flags, sets, scores = view.columns(records)

    def numpy(array: Any) -> Any:
        return array.to_numpy(zero_copy_only=False)

    label, source = base.column("label"), base.column("label_source")
    is_manual, is_engine = (
        numpy(pc.equal(source, "manual").fill_null(False)),
        numpy(pc.equal(source, "engine").fill_null(False)),
    )
    merged &= numpy(source.is_null()) | is_manual | is_engine  # a label source the trace model would refuse: one by one
    base_label = np.where(numpy(label.is_null()), 1, 2 + numpy(label.fill_null(False)).astype(np.int8))
    base_source = np.where(is_manual, 2, np.where(is_engine, 3, 1))
    base_review = numpy(base.column("manual_review").fill_null(False))
    base_manual = (base_label != 1) & (is_manual | ((base_source == 1) & base_review))  # `facts.manual_label`
    review_too = merged & (((flags & view.MANUAL) != 0) | ~base_manual)  # a person's label stays otherwise
    new_label, new_source, new_review = sets & 3, (sets >> 2) & 3, (sets >> 4) & 3
    score = np.array(base.column("reward_score").to_pylist(), dtype=object)
    patched_score = merged & ((flags & view.SCORE) != 0)
    score[patched_score] = np.where(np.isnan(scores), None, scores.astype(object))[patched_score]
    rewards = base.column("rewards").to_pylist()
    for i in np.flatnonzero(merged & ((flags & view.REWARDS) != 0)).tolist():
        rewards[i] = PatchRewards(view, int(records[i]))
    out = {
        "label": plain.LABEL_OBJECTS[np.where(review_too & (new_label != 0), new_label, base_label)].tolist(),
        "label_source": plain.SOURCE_OBJECTS[
            np.where(review_too & (new_source != 0), new_source, base_source)
        ].tolist(),
        "manual_review": np.where(review_too & (new_review != 0), new_review == 3, base_review).tolist(),
        "reward_score": score.tolist(),
        "rewards": rewards,
    }
    return merged, out
