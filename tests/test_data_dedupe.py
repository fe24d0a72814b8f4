"""SeenKeys (flowrl.data.dedupe) answers as a Python set of the keys would, one key or many at a time, across its
sorted runs, for keys ending in NUL bytes (which numpy's S16 drops when it gives bytes back) and odd-sized ones."""

from __future__ import annotations

import random

import pytest

from flowrl.data import dedupe
from flowrl.data.dedupe import SeenKeys


def test_seen_keys_answer_as_a_set_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedupe, "BUFFER", 5)  # many runs, merged
    rng = random.Random(0)
    pool = [rng.randbytes(15) + bytes([k % 3]) for k in range(60)]  # a third end in b"\0"
    pool += [b"\0" * 16, b"short", b""]
    seen, reference = SeenKeys(), set()
    for _ in range(200):
        if rng.random() < 0.5:
            key = rng.choice(pool)
            assert seen.add(key) == (key not in reference)
            reference.add(key)
        else:
            keys = [rng.choice(pool) for _ in range(rng.randint(0, 12))]
            expected = []
            for key in keys:
                expected.append(key not in reference)
                reference.add(key)
            assert seen.first(keys).tolist() == expected
    assert len(seen) == len(reference)
    assert len(seen._runs) > 1
