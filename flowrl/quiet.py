"""The libraries' noise flowrl controls: one place for what is silenced, and why.

- `KNOWN_DEPRECATIONS`: the FutureWarnings transformers 5 gives when TRL or PEFT read its old names
  (`is_gradient_checkpointing`, `gradient_checkpointing_enable` / `_disable`): printed on every training run and
  every merge, fixed upstream, nothing a user can act on.
- `quiet_libraries(bars=False)`: those warnings ignored and, with `bars` off, the loading bars of transformers
  ("Loading weights", "Writing model shards", and the GGUF loader's "Converting and de-quantizing GGUF
  tensors", which calls tqdm itself), huggingface_hub and datasets; everything comes back as it was on exit,
  so a caller of flowrl keeps its own settings.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

__all__ = ["KNOWN_DEPRECATIONS", "ignore_known_deprecations", "quiet_libraries"]

# modules that call tqdm themselves (transformers' GGUF loader: "Converting and de-quantizing GGUF tensors")
_OWN_TQDM = ("transformers.modeling_gguf_pytorch_utils",)
KNOWN_DEPRECATIONS = (
    r".*`is_gradient_checkpointing` is deprecated",
    r".*`gradient_checkpointing_(en|dis)able` is deprecated",
)


def ignore_known_deprecations() -> None:
    """Add the filters for `KNOWN_DEPRECATIONS` (inside `warnings.catch_warnings()` they go with it)."""
    for alias in KNOWN_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=alias, category=FutureWarning)


@contextmanager
def quiet_libraries(*, bars: bool = True) -> Iterator[None]:
    """See the module doc."""
    with warnings.catch_warnings(), ExitStack() as stack:
        ignore_known_deprecations()
        if not bars:
            import datasets  # lazy: only a command that loads models pays for these
            from huggingface_hub.utils import disable_progress_bars
            from transformers.utils import logging as hf_logging

            stack.enter_context(disable_progress_bars())  # re-enables on exit only if it was enabled
            if hf_logging.is_progress_bar_enabled():
                hf_logging.disable_progress_bar()
                stack.callback(hf_logging.enable_progress_bar)
            if datasets.is_progress_bar_enabled():
                datasets.disable_progress_bars()
                stack.callback(datasets.enable_progress_bars)
            for name in _OWN_TQDM:  # modules that call tqdm themselves, past the switches above
                module = importlib.import_module(name)
                stack.enter_context(mock.patch.object(module, "tqdm", functools.partial(module.tqdm, disable=True)))
        yield
