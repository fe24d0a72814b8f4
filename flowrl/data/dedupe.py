"""The conversation keys a build has already taken a trace of (`DatasetFilter.dedupe`): one trace per user turn.

A key is a 16-byte digest (`flowrl.trace.conversation.conversation_key`). A Python set of them costs about 90 bytes a
key, 90 MB at a million traces; `SeenKeys` keeps the newest keys in a set and the rest in sorted numpy runs of
16 bytes a key, merged as they grow (a log-structured set), and answers a segment's keys at once (`first`).
"""

from __future__ import annotations

from typing import Any

KEY_BYTES = 16
BUFFER = 65536  # keys kept in the set before they are sorted into a run


class SeenKeys:
    """A set of conversation keys: `add(key)` one at a time, `first(keys)` many at a time, in order."""

    def __init__(self) -> None:
        self._new: set[bytes] = set()
        self._runs: list[Any] = []  # sorted numpy arrays of dtype S16, largest first

    def __len__(self) -> int:
        return len(self._new) + sum(len(run) for run in self._runs)

    def add(self, key: bytes) -> bool:
        """Add `key`; whether it was new. A key that is not 16 bytes is kept as it is, in the set."""
        import numpy as np

        if key in self._new:
            return False
        if len(key) == KEY_BYTES:
            probe = np.array([key], dtype=f"S{KEY_BYTES}")
            if any(_holds(run, probe)[0] for run in self._runs):
                return False
        self._new.add(key)
        if len(self._new) >= BUFFER:
            self._spill()
        return True

    def first(self, keys: list[bytes]) -> Any:
        """For each of `keys` in order, whether it is new (not seen before, nor earlier in `keys`): what `add` gives
        one key at a time, as a numpy bool array; the new ones are added."""
        import numpy as np

        if any(len(key) != KEY_BYTES for key in keys):
            return np.array([self.add(key) for key in keys], dtype=bool)
        array = np.array(keys, dtype=f"S{KEY_BYTES}")
        _unique, at = np.unique(array, return_index=True)
        new = np.zeros(len(keys), dtype=bool)
        new[at] = True  # the first of equal keys in `keys`
        if self._new:
            new &= np.array([key not in self._new for key in keys], dtype=bool)
        for run in self._runs:
            new &= ~_holds(run, array)
        # the keys as given: numpy's S16 drops trailing NUL bytes when it gives bytes back
        self._new.update(key for key, is_new in zip(keys, new.tolist(), strict=True) if is_new)
        if len(self._new) >= BUFFER:
            self._spill()
        return new

    def _spill(self) -> None:
        """The set's 16-byte keys sorted into a run; runs of like size merged, so that there are few."""
        import numpy as np

        fixed = [key for key in self._new if len(key) == KEY_BYTES]
        self._new = {key for key in self._new if len(key) != KEY_BYTES}
        run = np.sort(np.array(fixed, dtype=f"S{KEY_BYTES}"))
        while self._runs and len(self._runs[-1]) <= len(run):
            run = np.sort(np.concatenate([self._runs.pop(), run]), kind="mergesort")
        self._runs.append(run)


def _holds(run: Any, keys: Any) -> Any:
    """For each of `keys`, whether the sorted `run` holds it."""
    import numpy as np

    at = np.searchsorted(run, keys)
    found = np.zeros(len(keys), dtype=bool)
    inside = at < len(run)
    found[inside] = run[at[inside]] == keys[inside]
    return found
