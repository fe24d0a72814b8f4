"""Secret masking, applied to every trace before anything is persisted.

What is masked (each match becomes `[REDACTED:<kind>]`):

| kind | what |
|---|---|
| `anthropic_key` | `sk-ant-…` |
| `openai_key` | `sk-…`, `sk-proj-…`, `sk-svcacct-…`, `sk-admin-…` |
| `github_token` | `ghp_/gho_/ghu_/ghs_/ghr_…`, `github_pat_…` |
| `aws_access_key_id` | `AKIA…`, `ASIA…`, `ABIA…`, `ACCA…` (20 characters) |
| `aws_secret_key` | a 40-character value after `aws_secret_access_key`, `secret_access_key` or `aws_secret_key` |
| `google_api_key` | `AIza…` (39 characters) |
| `slack_token` | `xoxb-/xoxa-/xoxp-/xoxr-/xoxs-…`, Slack webhook URLs |
| `bearer_token` | `Bearer <token>` (the token only) |
| `jwt` | three base64url parts starting `eyJ` |
| `private_key` | `-----BEGIN … PRIVATE KEY----- … -----END … PRIVATE KEY-----` blocks |
| `url_password` | the password in `scheme://user:password@host` |
| `assigned_secret` | the value in `password=…`, `api_key: …`, `secret=…`, `token=…` |

Dict values whose key names a secret (`api_key`, `authorization`, `password`, `secret`, `token`,
`cookie`, `private_key`, `client_secret`, … and `*_api_key`, `*_token`, `*_secret`, `*_password`) are
masked whole. Strings longer than `max_chars` keep their head and tail with a marker holding the
length and a SHA-256 of the full value.

A user `mask` callback runs after the built-in patterns on every string. If it raises, that whole
value becomes `[REDACTED:mask-failed]`: masking fails closed, never open.

Not covered: personal data (names, e-mail addresses, phone numbers), secrets in formats not listed
above, and secrets split across several values. Add a `mask` callback for those.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MASK_FAILED = "[REDACTED:mask-failed]"


@dataclass(frozen=True)
class _Pattern:
    kind: str
    regex: re.Pattern[str]
    prefilters: tuple[str, ...]  # cheap substring tests; the regex runs only if one is present
    case_insensitive_prefilter: bool = False
    group: int = 0  # which group to replace (0: the whole match)


def _p(kind: str, pattern: str, prefilters: tuple[str, ...], *, flags: int = 0, ci: bool = False,
       group: int = 0) -> _Pattern:
    return _Pattern(kind, re.compile(pattern, flags), prefilters, ci, group)


PATTERNS: tuple[_Pattern, ...] = (
    _p("private_key",
       r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
       ("PRIVATE KEY-----",)),
    _p("anthropic_key", r"(?<![A-Za-z0-9_])sk-ant-[A-Za-z0-9_\-]{16,}", ("sk-ant-",)),
    _p("openai_key", r"(?<![A-Za-z0-9_])sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}", ("sk-",)),
    _p("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})", ("gh", "github_pat_")),
    _p("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b", ("AKIA", "ASIA", "ABIA", "ACCA")),
    _p("aws_secret_key",
       r"(?i)((?:aws_?)?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
       ("secret",), ci=True, group=2),
    _p("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}", ("AIza",)),
    _p("slack_token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}|https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]+",
       ("xox", "hooks.slack.com")),
    _p("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", ("eyJ",)),
    _p("bearer_token", r"(?i)(\bbearer\s+)([A-Za-z0-9\-._~+/]{12,}=*)", ("bearer",), ci=True, group=2),
    _p("url_password", r"(\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]+:)([^\s@/]+)(@)", ("://",), group=2),
    _p("assigned_secret",
       r"(?i)(\b(?:password|passwd|pwd|api[_\-]?key|apikey|secret|client[_\-]?secret|access[_\-]?token|auth[_\-]?token)"
       r"[\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]{4,})",
       ("pass", "pwd", "key", "secret", "token"), ci=True, group=2),
)

SECRET_KEY_RE = re.compile(
    r"(?i)^(?:.*[_\-])?(?:api[_\-]?key|apikey|authorization|password|passwd|secret|token|cookie|"
    r"private[_\-]?key|client[_\-]?secret|access[_\-]?key|secret[_\-]?key|credentials?)$"
)
# Keys that look like secrets but hold counts (token usage) are kept.
_SAFE_KEYS = frozenset({"tokens", "max_tokens", "total_tokens", "tokens_in", "tokens_out"})


@dataclass
class RedactionStats:
    masked: int = 0
    mask_failures: int = 0
    truncated: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Redactor:
    """Masks secrets in strings and nested JSON-like values. Thread-safe; keeps counters."""

    def __init__(self, mask: Callable[[str], str] | None = None, *, max_chars: int | None = 65536,
                 mask_keys: bool = True) -> None:
        self.mask = mask
        self.max_chars = max_chars
        self.mask_keys = mask_keys
        self.stats = RedactionStats()
        self._lock = threading.Lock()

    def _count(self, kind: str) -> None:
        with self._lock:
            self.stats.masked += 1
            self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1

    def redact_text(self, text: str) -> str:
        """Mask every known secret in one string, then apply the user's mask (fail closed)."""
        lowered: str | None = None
        for pat in PATTERNS:
            if pat.case_insensitive_prefilter:
                if lowered is None:
                    lowered = text.lower()
                hit = any(p in lowered for p in pat.prefilters)
            else:
                hit = any(p in text for p in pat.prefilters)
            if not hit:
                continue
            text = self._sub(pat, text)
            lowered = None
        if self.mask is not None:
            try:
                masked = self.mask(text)
                if not isinstance(masked, str):
                    raise TypeError(f"mask returned {type(masked).__name__}, not str")
                text = masked
            except Exception:  # fail closed: the whole value goes
                with self._lock:
                    self.stats.mask_failures += 1
                    first = self.stats.mask_failures == 1
                if first:  # once with the traceback; the count is in stats.mask_failures
                    log.warning("flowrl: the mask callback raised; values it fails on are masked whole "
                                "(further failures are only counted)", exc_info=True)
                return MASK_FAILED
        return self._truncate(text)

    def _sub(self, pat: _Pattern, text: str) -> str:
        token = f"[REDACTED:{pat.kind}]"

        def repl(m: re.Match[str]) -> str:
            self._count(pat.kind)
            if pat.group == 0:
                return token
            start, end = m.span(pat.group)
            whole = m.group(0)
            offset = m.start(0)
            return whole[: start - offset] + token + whole[end - offset:]

        return pat.regex.sub(repl, text)

    def _truncate(self, text: str) -> str:
        limit = self.max_chars
        if limit is None or len(text) <= limit:
            return text
        with self._lock:
            self.stats.truncated += 1
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        keep = max(limit // 2 - 64, 16)
        dropped = len(text) - 2 * keep
        return f"{text[:keep]}…[truncated {dropped} chars, sha256={digest}]…{text[-keep:]}"

    def redact(self, value: Any, *, key: str | None = None) -> Any:
        """Mask a nested value: dicts, lists and tuples are walked, strings scanned, keys checked."""
        if isinstance(value, str):
            if self.mask_keys and key is not None and _is_secret_key(key) and value:
                self._count("secret_key_name")
                return "[REDACTED:secret_key_name]"
            return self.redact_text(value)
        if isinstance(value, dict):
            return {k: self.redact(v, key=k if isinstance(k, str) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact(v) for v in value]
        return value


def _is_secret_key(key: str) -> bool:
    return key.lower() not in _SAFE_KEYS and bool(SECRET_KEY_RE.match(key))


def redact_text(text: str) -> str:
    """Mask secrets in one string with the built-in patterns only."""
    return Redactor(max_chars=None).redact_text(text)
