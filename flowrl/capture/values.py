"""Captured values made JSON-safe, one value at a time (`Values`), on the writer thread.

A value with no JSON form (a lone surrogate, a 5,000-digit int, an object whose `str()` raises, a socket,
bytes that are not UTF-8, a tuple key, a container inside itself) becomes a marked placeholder,
`<unserialisable TYPE: WHAT>`, and the values around it are kept: one bad value never loses a run
(docs/capture.md, "Values that have no JSON form"). `flowrl.capture.assemble` builds traces with it.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import ipaddress
import numbers
import re
import uuid
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from flowrl.capture.events import ErrorText, TextParts
from flowrl.capture.registration import DEFAULT_MAX_CHARS

MAX_DEPTH = 64  # containers nested deeper are cut there (orjson refuses past 255 levels in all)
REPR_CHARS = 200  # of an object's repr() in its placeholder
MASK_MARGIN = 8192  # a secret this long across a cut is still masked whole (see Values.cut)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what JSON writers (orjson) take as numbers
_SURROGATES = re.compile("[\ud800-\udfff]")
_SEQUENCES = (list, tuple, set, frozenset, collections.deque)
# types with one JSON form (pydantic's): dates and times in ISO 8601, the others as text
_LEAVES = (
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
    decimal.Decimal,
    PurePath,
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
)


def unserialisable(kind: str, detail: str) -> str:
    """The placeholder of a value with no JSON form: `<unserialisable int: 5000 digits>`."""
    return f"<unserialisable {kind}: {detail}>"


def type_name(value: Any) -> str:
    return type(value).__name__


def _digits(n: int) -> str:
    """How many decimal digits `n` has, without str() (refused past 4300 digits)."""
    n = abs(n)
    bits = n.bit_length()
    low = int(max(bits - 1, 0) * 0.30102999566398120) + 1  # the digits of 2**(bits-1)
    if bits > 1 << 16:  # 10**low would cost more than the answer is worth
        return f"about {low} digits"
    return f"{low + 1 if n >= 10**low else low} digits"


def _valid_text(text: str) -> str:
    """`text` as an exact str without lone surrogates (each becomes U+FFFD: JSON has no form for them)."""
    if type(text) is not str:
        text = str.__str__(text)
    if text.isascii() or _SURROGATES.search(text) is None:
        return text
    return _SURROGATES.sub("\ufffd", text)


class Values:
    """Captured values made JSON-safe on the writer thread: total (never raises) and per value (one that
    cannot be written becomes a marked placeholder; the values around it are kept).

    - `plain(value)`: JSON data. Containers are walked (a snapshot of each); a container inside itself,
      or nested deeper than `MAX_DEPTH`, becomes a placeholder. Keys become text as `json.dumps` makes
      them (`None` -> "null"); another key becomes its placeholder. Dataclasses and pydantic models
      become dicts of their fields, enums their value, dates ISO text, bytes their UTF-8 text.
    - `text(value)`: the value's `str()`, for fields that are text (results, answers, errors).
    - Every string longer than `limit` (the hook's `max_chars`) keeps its head and tail (`cut`), so no
      later step (masking, validation, serialisation) works on more than `limit` characters at a time.
    - Ints beyond 64 bits are written as their digits (text); anything else with no JSON form becomes
      `unserialisable(type, what)`.
    """

    def __init__(self, limit: int | None = DEFAULT_MAX_CHARS, premask: Any = None) -> None:
        self.limit = limit
        self.keep = None if limit is None else max(limit // 2 - 64, 16)  # as flowrl.trace.redact.Redactor keeps
        self.premask = premask  # a Redactor (built-in patterns only) for the edges of what is cut
        self._cuts: dict[int, tuple[Any, str]] = {}  # id(long string) -> (it, its cut): each is cut once

    def text(self, value: Any) -> str:
        try:
            if value is None:
                return ""
            if isinstance(value, str):
                return self.string(value)
            if isinstance(value, ErrorText):
                return f"{value.name}: {self.text(value.message)}"
            if isinstance(value, TextParts):
                return self.joined(value.parts)
            if isinstance(value, int) and not isinstance(value, bool):
                out = self.plain(value)
                return out if isinstance(out, str) else str(out)
            text = str(value)
        except BaseException as exc:  # the writer thread's own: nothing here is the host's to see
            return unserialisable(type_name(value), f"str() raised {type_name(exc)}")
        return self.string(text)

    def plain(self, value: Any, depth: int = 0, path: set[int] | None = None) -> Any:
        try:
            return self._plain(value, depth, set() if path is None else path)
        except BaseException as exc:
            return unserialisable(type_name(value), f"reading it raised {type_name(exc)}")

    def _plain(self, value: Any, depth: int, path: set[int]) -> Any:
        kind = type(value)
        if kind is str:
            return self.string(value)
        if value is None or kind is bool or kind is float:
            return value
        if kind is int:
            return value if _INT_MIN <= value <= _INT_MAX else self.big_int(value)
        if kind is dict or isinstance(value, Mapping):
            return self._container(value, depth, path, lambda: list(value.items()))
        if isinstance(value, _SEQUENCES):
            return self._container(value, depth, path, lambda: list(value))
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, (ErrorText, TextParts)):
            return self.text(value)
        if isinstance(value, enum.Enum):
            return self._container(value, depth, path, lambda: value.value, one=True)
        if isinstance(value, numbers.Integral):
            return self._plain(int(value), depth, path)
        if isinstance(value, numbers.Real):
            return float(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.binary(value)
        if isinstance(value, BaseModel):
            names = [*type(value).model_fields, *(value.__pydantic_extra__ or {})]
            return self._container(value, depth, path, lambda: [(n, getattr(value, n)) for n in names])
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = dataclasses.fields(value)
            return self._container(value, depth, path, lambda: [(f.name, getattr(value, f.name)) for f in fields])
        if isinstance(value, _LEAVES):
            return self._plain(to_jsonable_python(value), depth, path)
        return unserialisable(type_name(value), self.repr_of(value))

    def _container(self, value: Any, depth: int, path: set[int], read: Any, one: bool = False) -> Any:
        key = id(value)
        if key in path:
            return unserialisable(type_name(value), "contains itself")
        if depth >= MAX_DEPTH:
            return unserialisable(type_name(value), f"nested deeper than {MAX_DEPTH}")
        path.add(key)
        try:
            content = read()  # a snapshot: a list copy is one step, whatever another thread does
            if one:
                return self.plain(content, depth + 1, path)
            plain, simple = self.plain, self._simple
            if isinstance(value, (Mapping, BaseModel)) or dataclasses.is_dataclass(value):
                out: dict[str, Any] = {}
                for k, v in content:
                    out[self.key(k, out)] = v if simple(v) else plain(v, depth + 1, path)
                return out
            return [v if simple(v) else plain(v, depth + 1, path) for v in content]
        finally:
            path.discard(key)

    def _simple(self, value: Any) -> bool:
        """A value that is JSON data as it is (most are): kept without a further look."""
        kind = type(value)
        if kind is str:
            return value.isascii() and (self.limit is None or len(value) <= self.limit)
        return value is None or kind is bool or kind is float or (kind is int and _INT_MIN <= value <= _INT_MAX)

    def key(self, key: Any, taken: dict[str, Any]) -> str:
        if type(key) is str and key not in taken and self._simple(key):
            return key
        if isinstance(key, str):
            text = self.string(key)
        elif key is None or isinstance(key, (bool, int, float)):
            value = self.plain(key)  # an int beyond 64 bits is already text
            text = value if isinstance(value, str) else _json_key(value)
        else:
            text = unserialisable(type_name(key), self.repr_of(key))
        if text in taken:  # two keys with one text form (1 and "1"): both kept
            n = 2
            while f"{text} <duplicate key {n}>" in taken:
                n += 1
            text = f"{text} <duplicate key {n}>"
        return text

    def big_int(self, value: int) -> str:
        try:
            return str(value)
        except ValueError:  # past Python's int -> str limit (4300 digits by default)
            return unserialisable("int", _digits(value))

    def binary(self, value: bytes | bytearray | memoryview) -> str:
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        if self.limit is not None and size > 4 * self.limit:
            return unserialisable(type_name(value), f"{size} bytes, not decoded (over 4 x max_chars)")
        try:
            return self.string(bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            return unserialisable(type_name(value), f"{size} bytes, not UTF-8")

    def repr_of(self, value: Any) -> str:
        try:
            text = repr(value)
        except BaseException as exc:
            return f"repr() raised {type_name(exc)}"
        return _valid_text(text if len(text) <= REPR_CHARS else text[:REPR_CHARS] + "…")

    # -- strings ---------------------------------------------------------------------------------
    def string(self, text: str) -> str:
        if type(text) is str and text.isascii() and (self.limit is None or len(text) <= self.limit):
            return text
        if self.limit is not None and len(text) > self.limit:
            done = self._cuts.get(id(text))
            if done is None or done[0] is not text:
                done = self._cuts[id(text)] = (text, self.cut(text, len(text)))
            return done[1]
        return _valid_text(text)

    def joined(self, parts: list[str]) -> str:
        """A streamed answer: its parts joined, or only their head and tail when that is over `limit`."""
        total = sum(len(p) for p in parts)
        if self.limit is None or total <= self.limit:
            return self.string("".join(parts))
        return self.cut(_Parts(parts, total), total)

    def cut(self, text: Any, n: int) -> str:
        """Head and tail of a long string around `…[truncated N chars]…` (N: characters dropped), the way
        `flowrl.trace.redact.Redactor` keeps them, in O(limit) steps. With masking on, the edges are read with a
        `MASK_MARGIN` and masked (built-in patterns) before they are cut, so a secret across a cut is
        masked whole, as when the whole value is masked first. No digest: one of the whole value would be
        taken before masking (a handle on short secrets) or after masking all of it (the unbounded work
        this avoids)."""
        keep = self.keep or 0
        region = keep + (MASK_MARGIN if self.premask is not None else 0)
        head, tail = _valid_text(text[:region]), _valid_text(text[max(0, n - region) :])
        if self.premask is not None:
            head, tail = self.premask.redact_text(head), self.premask.redact_text(tail)
        return f"{head[:keep]}…[truncated {n - 2 * keep} chars]…{tail[-keep:]}"


class _Parts:
    """Slices of a list of strings, as if joined (for `Values.cut`)."""

    def __init__(self, parts: list[str], total: int) -> None:
        self.parts, self.total = parts, total

    def __getitem__(self, span: slice) -> str:
        start, stop = span.start or 0, self.total if span.stop is None else span.stop
        out, at = [], 0
        for part in self.parts:
            end = at + len(part)
            if end > start and at < stop:
                out.append(part[max(0, start - at) : stop - at])
            at = end
        return "".join(out)


def _json_key(key: Any) -> str:
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return repr(key) if isinstance(key, float) else str(key)
