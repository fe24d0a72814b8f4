"""The deterministic train/validation split.

A group (one task) goes to `validation` when `blake2b(seed:group_id)` read as a fraction of 2**64 is
below `val_fraction`, else to `train`. Every row of a group lands on the same side, so one task never
appears on both; the same store, options and seed always give the same split, on any machine, and
a trace added later never moves an existing task across.
"""

from __future__ import annotations

import hashlib

from flowrl.errors import ConfigError

TRAIN = "train"
VALIDATION = "validation"
SPLITS: tuple[str, ...] = (TRAIN, VALIDATION)


def check_fraction(val_fraction: float) -> float:
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"validation fraction {val_fraction}: use a number in [0, 1)")
    return val_fraction


def split_for(group_id: str, val_fraction: float, seed: int = 0) -> str:
    """`train` or `validation` for every row of the group `group_id`."""
    if val_fraction <= 0.0:
        return TRAIN
    digest = hashlib.blake2b(f"{seed}:{group_id}".encode(), digest_size=8).digest()
    return VALIDATION if int.from_bytes(digest, "big") / 2**64 < val_fraction else TRAIN
