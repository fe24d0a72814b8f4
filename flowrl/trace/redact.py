"""Secret masking, applied to every trace before anything is persisted.

Each secret found becomes `[REDACTED:<kind>]`, found three ways, in this order:

1. **By format** (the token alone is replaced): `private_key` (PEM blocks, `AGE-SECRET-KEY-1…`), the
   providers in `_PROVIDERS` (OpenAI, Anthropic, Stripe `sk_/rk_live_`, GitHub, GitLab `glpat-`, AWS key ids,
   Google `AIza`/`GOCSPX-`, Hugging Face `hf_`, SendGrid `SG.`, npm, PyPI and others), `telegram_bot_token`,
   `jwt`, `slack_token` (and Slack/Discord webhooks), `url_password` (`scheme://user:password@host`, user
   optional), `curl_user` (`curl -u user:password`), `basic_auth` (`Basic` + base64 of `user:password`),
   `bearer_token`, `authorization` and `cookie` header values, `aws_secret_key`, `netrc_password` and
   `cli_password` (`docker login -p`, `sshpass -p`, `mysql -p…`).
2. **By name** (`assigned_secret`): the value given to a name that names a secret (`_is_secret_key`: it ends in
   `password`, `passphrase`, `secret`, `token`, `api_key`, `access_key`, `credentials`, `signature`, `pwd`, …,
   in any case, after `_`, `-`, `.` or nothing: `DB_PASSWORD`, `_authToken`, `SecretAccessKey`, `PGPASSWORD`)
   in text (`name=value`, `name: value`, `"name": "value"`, escaped JSON, `--name value`, `<name>value</name>`,
   `name is value`, `define('NAME', 'value')`), and (`secret_key_name`) whole dict values under such a key,
   at any depth. A JSON string is parsed and masked value by value, so JSON inside JSON is masked too; it
   is re-serialised only if something was masked. Not a secret: a code expression (`os.environ[…]`,
   `getpass.getpass()`, `settings.X`, a variable passed on as in `f(password=password)`), a type
   (`password: str`), a placeholder (`${DB_PASSWORD}`, `<token>`, `%s`, `sk-...`), a tokenizer's token.
3. **By entropy** (`high_entropy_secret`): a long random-looking base64 or hex token within 32 characters
   after a secret word (`api key is 3f9a…`).

Strings longer than `max_chars` keep their head and tail with a marker holding the length and a SHA-256
of the full value. A user `mask` callback runs after the built-in patterns on every string. If it raises
anything at all (`SystemExit` and `KeyboardInterrupt` included), or returns something other than a string,
the whole value becomes `[REDACTED:mask-failed]` and is counted (`stats.mask_failures`): masking fails
closed, never open, and never raises.

Not covered: personal data (names, e-mail addresses, phone numbers), secrets in formats not listed and
under names not listed (a `.pgpass` line), and secrets split across several values. Add a `mask` callback
for those. Rates measured on a corpus: `python -m tests.test_redact_corpus`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MASK_FAILED = "[REDACTED:mask-failed]"
_MARK = "[REDACTED:"

Finder = Callable[[re.Match[str], str], "tuple[int, int] | None"]


@dataclass(frozen=True)
class _Pattern:
    kind: str
    regex: re.Pattern[str]
    # Substrings of which every match holds one (as written; for `lower`, also in UPPER and Capitalized case):
    # a text with none is skipped. `flowrl.capture.masking` compiles them into its own quick test.
    prefilters: tuple[str, ...]
    case_insensitive_prefilter: bool = False  # always False: the cases are in `prefilters` (a cheaper test)
    group: int | str = 0  # which group to replace (0: the whole match)
    find: Finder | None = None  # decides what to replace, or None: this match is not a secret
    anchored: bool = False  # every match starts with one of `words`: tried only where one occurs (fast)
    lower: bool = False  # the regex runs on the lower-cased text (`_lower`); its literals are lower case
    words: tuple[str, ...] = ()  # the prefilters in lower case


def _p(
    kind: str,
    pattern: str,
    words: tuple[str, ...],
    *,
    ci: bool = False,
    group: int | str = 0,
    find: Finder | None = None,
    anchored: bool = False,
) -> _Pattern:
    cases = tuple(dict.fromkeys(c for w in words for c in ((w, w.upper(), w.capitalize()) if ci else (w,))))
    lowered = tuple(w.lower() for w in words)
    return _Pattern(kind, re.compile(pattern), cases, False, group, find, anchored, ci, lowered)


def _matches(pat: _Pattern, where: str) -> Iterator[re.Match[str]]:
    """`pat.regex.finditer(where)`; for an anchored pattern, by trying the regex only where a prefilter occurs."""
    if not pat.anchored:
        yield from pat.regex.finditer(where)
        return
    starts = []
    for word in pat.words:
        i = where.find(word)
        while i >= 0:
            starts.append(i)
            i = where.find(word, i + 1)
    end = 0
    for i in sorted(starts):
        if i >= end and (m := pat.regex.match(where, i)) is not None:
            end = m.end()
            yield m


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _lower(text: str) -> str:
    """Lower case with the same length, so a match's span in it is the span in `text`."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)  # `İ` lower-cases to two


def _g(m: re.Match[str], text: str, group: int | str) -> str:
    """A group's text in the original string (the regex may have run on the lower-cased one)."""
    start, end = m.span(group)
    return text[start:end] if start >= 0 else ""


# -- names that name a secret --------------------------------------------------------------------------------

SECRET_KEY_RE = re.compile(
    r"(?i)^(?:.*?(?:pass(?:word|wd|phrase)|secret|token|pwd|credentials?|authorization|cookies?|signature"
    r"|(?:api|access|secret|private|account|signing|encryption|master|session|shared|subscription|auth|client"
    r"|storage|service|app)[_\-. ]?key)(?:[_\-. ]?(?:value|string|b64|base64))?"
    r"|(?:.*[_\-. ])?(?:pass|pw|auth|sig))$"
)
# Names that end like a secret but hold none: pagination cursors and a tokenizer's special tokens.
_SAFE_ENDINGS = (
    "pagetoken",
    "nexttoken",
    "continuationtoken",
    "synctoken",
    "cursortoken",
    "bostoken",
    "eostoken",
    "padtoken",
    "unktoken",
    "septoken",
    "clstoken",
    "masktoken",
    "starttoken",
    "endtoken",
    "stoptoken",
    "pertoken",
)
_SAFE_NAMES = frozenset({"ntoken", "numtoken", "maxtoken"})  # counts


def _compact(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _is_secret_key(key: str) -> bool:
    if not SECRET_KEY_RE.match(key):
        return False
    compact = _compact(key)
    return not compact.endswith(_SAFE_ENDINGS) and compact not in _SAFE_NAMES


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")


def _name_start(lowered: str, kw_start: int) -> int | None:
    """Where the name holding the keyword at `kw_start` begins (None: over 60 characters, or after `$`/`@`)."""
    start, low = kw_start, max(0, kw_start - 60)
    while start > low and (lowered[start - 1] in _NAME_CHARS or lowered[start - 1].isalnum()):
        start -= 1
    before = lowered[start - 1] if start else ""
    return None if before and (before in _NAME_CHARS or before.isalnum() or before in "$@") else start


# -- what a value looks like ---------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(
    r"\$\{.*\}|\$\(.*\)|\$[A-Za-z_]\w*|\{\{.*\}\}|\{[\w.\[\]'\"]*\}|<[^<>]*>|%\(?\w*\)?[sdr]|:[A-Za-z_]\w*|\?"
    r"|[x*X.•#_\-]{3,}|.*(?:\.\.\.|…)|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[a-z]+(?:_[a-z]+)+"  # elided; a name
    r"|.*(?:%[sd(]|\{[\w.]*\}).*|\[[A-Z0-9_]+\]"  # a template; a special token (`[MASK]`)
    r"|(?i:(?:your|test|fake|dummy|mock|example|sample)(?:[_\-]\w+)*|redacted|placeholder|none|null"
    r"|pass(?:word|wd)?|pwd|secret|token)"
)
_CODE = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*(?:\(.*\)|\[.*\])?")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CAMEL = re.compile(r"(?:[A-Z][a-z0-9]+){2,}")
_PLAIN_WORD = re.compile(r"[A-Za-z][a-z]*|[a-z_]+|[A-Z_]+")
_WORDY = re.compile(r"(?:[A-Z]?[a-z]{2,}|[A-Z]+|\d{1,4}[a-z]?)+")  # `Gemma3nEmbedder`: words, not random
_NOT_SECRET = frozenset(
    {
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "str",
        "string",
        "int",
        "bytes",
        "bool",
        "float",
        "any",
        "object",
        "secretstr",
        "secretbytes",
        "optional",
        "required",
        "bearer",
        "basic",
        "token",
        "digest",
    }
)


def _placeholder(value: str) -> bool:
    return bool(_PLACEHOLDER.fullmatch(value.strip()))


def _not_placeholder(value: str) -> bool:
    return not _placeholder(value)


def _is_code(value: str, after: str) -> bool:
    """A reference or call in code (`os.environ[…]`, `getpass.getpass()`, `settings.X`), not a literal."""
    return bool(_CODE.fullmatch(value)) and (after in ("(", "[") or "." in value or value.endswith((")", "]")))


def _entropy(value: str) -> float:
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def _random_token(value: str) -> bool:
    """Long, one unbroken random run (not `meta-llama/Llama-3-8B`), high in entropy for its alphabet."""
    if len(value) < 20 or max(len(part) for part in re.split(r"[-_/+]", value)) < 16:
        return False
    if re.fullmatch(r"[0-9a-fA-F]+", value):
        return any(c.isdigit() for c in value) and any(c.isalpha() for c in value) and _entropy(value) >= 3.0
    if all(_WORDY.fullmatch(part) for part in re.split(r"[-_/+.]", value) if part):
        return False  # `thinkingmachines/Inkling-NVFP4`
    has = (any(c.isupper() for c in value), any(c.islower() for c in value), any(c.isdigit() for c in value))
    return has[0] and has[1] and (has[2] or len(value) >= 32) and _entropy(value) >= 3.5


def _word_start(m: re.Match[str], text: str) -> tuple[int, int] | None:
    """The whole match, if it starts a word (`ghp_…`, not `xghp_…`)."""
    before = text[m.start() - 1] if m.start() else " "
    return None if before.isalnum() or before == "_" else m.span()


def _group_if(group: str, ok: Callable[[str], bool]) -> Finder:
    def find(m: re.Match[str], text: str) -> tuple[int, int] | None:
        return m.span(group) if ok(_g(m, text, group)) else None

    return find


def _curl_password(m: re.Match[str], text: str) -> tuple[int, int] | None:
    """`curl -u user:PASSWORD` (the flag starting a word)."""
    ok = (m.start() == 0 or text[m.start() - 1].isspace()) and not _placeholder(_g(m, text, "value"))
    return m.span("value") if ok else None


def _basic_credentials(value: str) -> bool:
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return ":" in raw and raw.isprintable()


def _header_value(value: str) -> bool:
    return (
        len(value) >= 6
        and _MARK not in value
        and not _placeholder(value)
        and not _PLAIN_WORD.fullmatch(value)
        and not _is_code(value, "")
    )


def _cookie_value(value: str) -> bool:
    value = value.strip()
    return (
        _MARK not in value
        and not _placeholder(value)
        and not _is_code(value.rstrip("("), value[-1:])
        and ("=" in value or (len(value) >= 16 and " " not in value))
    )


def _assigned(m: re.Match[str], text: str) -> tuple[int, int] | None:  # noqa: C901  # one branch per assignment form a secret hides in
    """The value given to a secret's name, unless it is code, a type, a placeholder or prose."""
    name_start = _name_start(m.string, m.start("kw"))
    if name_start is None:
        return None
    name = text[name_start : m.start("sep")]
    sep, quote, value = _g(m, text, "sep"), _g(m, text, "q"), _g(m, text, "value")
    compact = _compact(name)
    if not _is_secret_key(name) or _MARK in value or compact.endswith(("authorization", "cookie", "cookies")):
        return None
    start, end = m.span("value")
    before = text[name_start - 1] if name_start else ""
    if compact == "sig" and before not in ("?", "&", ";"):
        return None  # `sig` is a secret in a signed URL (`&sig=…`); elsewhere a variable
    if "," in sep and not (quote and before in ("'", '"') and sep.lstrip("\\").startswith(before) and name.isupper()):
        return None  # a pair is `("NAME", "value")`: both quoted, the name in capitals (`setenv`, `define`)
    if quote and before and before in "'\"`" and before not in sep and quote.endswith(before):
        return None  # the quote closes the string the name is in: `input("Password: ")`
    if compact.endswith("token") and (len(value) < 8 or " " in value):
        return None  # a tokenizer's token (`{"token": " there", "logprob": …}`), not a credential
    if sep == ":" and not quote:
        return None  # `passwd:name`: no space after the colon, so neither YAML nor JSON
    if sep.strip().lower() in ("is", "was", "to"):  # prose: the value runs to the next space
        end = start + len(text[start:].split(None, 1)[0].rstrip(".,;:!?)\"'`"))
        value = text[start:end]
        ok = (
            len(value) >= 6
            and compact not in ("pass", "auth", "pw", "sig")
            and any(c.isdigit() for c in value)
            and not re.search(r"[`'\"(){}\[\]<>:]", value)
            and not _PLAIN_WORD.fullmatch(value)
        )
        return (start, end) if ok and not _placeholder(value) and not _is_code(value, "") else None
    if quote and not quote.endswith("`"):
        return None if len(value) < 3 or _placeholder(value) else (start, end)
    if quote and any(c.isspace() for c in value):
        return None  # `code` or prose in backticks
    after = text[end : end + 1]
    if _placeholder(value) or value.lower() in _NOT_SECRET or (compact in ("pwd", "oldpwd") and value[0] in "/~"):
        return None
    if before and before in "?&#;" or (sep == "=" and name.isupper()):
        return start, end  # a query string, connection string or environment line: never code
    if _is_code(value, after) or value == name.rsplit(".", 1)[-1]:
        return None  # code, or `f(auth=auth)`
    if _IDENT.fullmatch(value) and not any(c.isdigit() for c in value):  # a variable, or a word
        head = text[:name_start].rstrip()[-1:]
        if "=" in sep and (sep.lstrip("\\\"'`]")[:1].isspace() or head in ("(", ",")):
            return None  # `password = password`, `f(api_key=api_key)`
        if ":" in sep and re.match(r"[ \t]*(?:[,)};|]|=[^=])", text[end : end + 8]):
            return None  # `{"password": pwd}`, `(password: str)`, `key: Path | None = None`
        if ":" in sep and _CAMEL.fullmatch(value):
            return None  # a type: `sig: ExportGraphSignature`
        if after == " " and text[end + 1 : end + 2].isalpha():
            return None  # prose: "Password: at least twelve characters"
    return start, end


def _flag(m: re.Match[str], text: str) -> tuple[int, int] | None:
    """`--api-token VALUE`."""
    name_start = _name_start(m.string, m.start("kw"))
    value = _g(m, text, "value")
    ok = (
        name_start is not None
        and text[name_start] == "-"
        and _is_secret_key(text[name_start : m.start("gap")])
        and len(value) >= 6
        and value[0] not in "-[<{"
        and _MARK not in value
        and not _PLAIN_WORD.fullmatch(value)
        and not _placeholder(value)
        and not _is_code(value, "")
    )
    return m.span("value") if ok else None


def _element(m: re.Match[str], text: str) -> tuple[int, int] | None:
    """`<password>VALUE</password>`."""
    return m.span("value") if _is_secret_key(m.group("name")) and _header_value(_g(m, text, "value")) else None


# -- the patterns, in the order they run ---------------------------------------------------------------------
# Those with `ci=True` run on the lower-cased text (see `_lower`): their literals are written in lower case.

_WORDS = r"pass|pw|secret|token|key|credential|auth|cookie|sig"
_KEYWORDS = ("key", "token", "pass", "auth", "secret", "pw", "credential")  # prefilters: _WORDS, less the rare
_VALUE_QUOTE = r"\\{0,3}[\"'`]"
# `name = value`, `"name": "value"`, `name is value`, `("NAME", "value")`: the value quoted or bare. The
# regex starts at the keyword (fast to find) and wants a name that ends like a secret's; `_assigned` finds
# where the name begins and decides.
_NAME_END = (
    "(?:"
    + "|".join(
        f"(?<={end})"
        for end in (
            "pass",
            "pw",
            "pwd",
            "passwd",
            "password",
            "phrase",
            "secret",
            "token",
            "key",
            "credential",
            "credentials",
            "authorization",
            "auth",
            "cookie",
            "cookies",
            "signature",
            "sig",
            "value",
            "string",
            "b64",
            "base64",
        )
    )
    + ")"
)
_SEP = (
    rf"(?P<sep>{_VALUE_QUOTE}?\]?(?:[ \t]{{0,4}}(?:=>|:=|=(?![=~]))|:(?![:/]))[ \t]{{0,16}}"
    rf"|[ \t]+(?:is|was|to)[ \t]+|{_VALUE_QUOTE}[ \t]*,[ \t]*)"
)
_VALUE = (
    rf"(?P<q>{_VALUE_QUOTE})?(?P<value>(?(q)(?!(?P=q))[^\n]{{1,2048}}?"  # quoted: up to the same quote
    r"|[^\s\"'`,;&|<>(){}\[\]\\]{3,512}))(?(q)(?P=q))"
)  # bare: up to a space or a delimiter
_PROVIDERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("anthropic_key", r"sk-ant-[A-Za-z0-9_\-]{16,}", ("sk-ant-",)),
    ("openai_key", r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}", ("sk-",)),
    (
        "stripe_key",
        r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,}",
        ("k_live_", "k_test_", "whsec_"),
    ),
    ("github_token", r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}", ("gh", "github_pat_")),
    ("gitlab_token", r"gl(?:pat|dt|rt|ptt|cbt|soat|ft|imt|agent|oas)-[A-Za-z0-9_\-]{20,}", ("gl",)),
    (
        "aws_access_key_id",
        r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])",
        ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
    ),
    ("google_api_key", r"AIza[0-9A-Za-z_\-]{35}", ("AIza",)),
    ("google_oauth_secret", r"GOCSPX-[A-Za-z0-9_\-]{24,}", ("GOCSPX-",)),
    ("huggingface_token", r"(?:hf_|api_org_)[A-Za-z0-9]{30,}", ("hf_", "api_org_")),
    ("sendgrid_key", r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}", ("SG.",)),
    ("npm_token", r"npm_[A-Za-z0-9]{36}", ("npm_",)),
    ("pypi_token", r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}", ("pypi-",)),
    ("shopify_token", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}", ("shp",)),
    ("digitalocean_token", r"do[opr]_v1_[a-f0-9]{64}", ("_v1_",)),
    ("databricks_token", r"dapi[a-f0-9]{32}(?:-\d)?", ("dapi",)),
    ("vault_token", r"hv[sbr]\.[A-Za-z0-9_\-]{24,}", ("hvs.", "hvb.", "hvr.")),
    ("groq_key", r"gsk_[A-Za-z0-9]{48,}", ("gsk_",)),
    ("langsmith_key", r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}", ("lsv2_",)),
    ("mailchimp_key", r"[0-9a-f]{32}-us\d{1,2}", ("-us",)),
    ("mailgun_key", r"key-[0-9a-f]{32}", ("key-",)),
    ("square_token", r"sq0(?:atp|csp)-[A-Za-z0-9_\-]{22,43}", ("sq0",)),
    ("twilio_key", r"SK[0-9a-fA-F]{32}(?![A-Za-z0-9])", ("SK",)),
    ("postman_key", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}", ("PMAK-",)),
    ("linear_key", r"lin_api_[A-Za-z0-9]{40}", ("lin_api_",)),
    ("doppler_token", r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,}", ("dp.",)),
    ("replicate_token", r"r8_[A-Za-z0-9]{37}", ("r8_",)),
    ("xai_key", r"xai-[A-Za-z0-9]{50,}", ("xai-",)),
    ("sentry_token", r"sntry[su]_[A-Za-z0-9+/=_]{40,}", ("sntry",)),
    ("grafana_token", r"glsa_[A-Za-z0-9]{32}_[a-fA-F0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2}", ("glsa_", "glc_")),
    ("newrelic_key", r"NRAK-[A-Z0-9]{27}", ("NRAK-",)),
    ("planetscale_token", r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9_\-.=]{32,64}", ("pscale_",)),
    ("supabase_token", r"sbp_[a-f0-9]{40}", ("sbp_",)),
    ("tailscale_key", r"tskey-[a-z]+-[A-Za-z0-9]{10,}-[A-Za-z0-9]{20,}", ("tskey-",)),
    ("azure_client_secret", r"[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}", ("Q~",)),
    ("alibaba_key", r"LTAI[A-Za-z0-9]{20}", ("LTAI",)),
    ("atlassian_token", r"ATATT3[A-Za-z0-9_\-=]{150,}", ("ATATT3",)),
)

PATTERNS: tuple[_Pattern, ...] = (
    _p(
        "private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)|AGE-SECRET-KEY-1[0-9A-Z]{50,}",
        ("PRIVATE KEY", "AGE-SECRET-KEY-"),
    ),
    *(_p(kind, body, pre, find=_word_start) for kind, body, pre in _PROVIDERS),
    _p("telegram_bot_token", r"(?<!\d)\d{8,10}:AA[A-Za-z0-9_\-]{33}", (":AA",)),  # also in `/bot<token>/`
    _p("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", ("eyJ",)),
    _p(
        "slack_token",
        r"\bxox[abposre]-[A-Za-z0-9\-]{10,}|\bxapp-\d-[A-Za-z0-9\-]{10,}"
        r"|https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-]+",
        ("xox", "xapp-", "hooks.slack.com"),
    ),
    _p(
        "discord_webhook",
        r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]+",
        ("discord",),
    ),
    _p("url_password", r"://[^\s:/@]*:(?P<value>[^\s@/]+)@", ("://",), find=_group_if("value", _not_placeholder)),
    _p(
        "curl_user",
        r"(?:-u|--user)[\s=]+[\"']?[^\s:\"'/]+:(?P<value>[^\s\"'@]+)",
        ("-u", "--user"),
        find=_curl_password,
    ),
    _p(
        "basic_auth",
        r"\bbasic\s+(?P<value>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])",
        ("basic",),
        ci=True,
        find=_group_if("value", _basic_credentials),
    ),
    _p(
        "bearer_token",
        r"\bbearer\s+(?P<value>[A-Za-z0-9\-._~+/]{12,}=*)",
        ("bearer",),
        ci=True,
        find=_group_if("value", lambda v: not _PLAIN_WORD.fullmatch(v)),
    ),
    _p(
        "authorization",
        rf"authorization(?<!\wauthorization){_VALUE_QUOTE}?\s*[:=]\s*{_VALUE_QUOTE}?"
        r"(?:(?:basic|bearer|token|digest|negotiate|ntlm|bot|apikey|api-key|key|sso-key)\s+)?"
        r"(?P<value>[^\s\"'`\\,;]+)",
        ("authorization",),
        ci=True,
        find=_group_if("value", _header_value),
    ),
    _p(
        "cookie",
        rf"cookie(?<!\wcookie){_VALUE_QUOTE}?\s*[:=]\s*{_VALUE_QUOTE}?(?P<value>[^\r\n\"'`\\]+)",
        ("cookie",),
        ci=True,
        find=_group_if("value", _cookie_value),
    ),
    _p(
        "aws_secret_key",
        r"(secret_?(?:access_?)?key\\{0,3}[\"']?\s*[:=]\s*\\{0,3}[\"']?)([a-z0-9/+=]{40})"
        r"(?![a-z0-9/+=])",
        ("secret",),
        ci=True,
        group=2,
    ),
    _p(
        "assigned_secret",
        rf"(?P<kw>{_WORDS})[\w.\-]{{0,40}}+{_NAME_END}{_SEP}{_VALUE}",
        (*_KEYWORDS, "cookie", "sig"),
        ci=True,
        find=_assigned,
        anchored=True,
    ),
    _p(
        "assigned_secret",
        rf"(?P<kw>{_WORDS})[\w\-]{{0,40}}+{_NAME_END}(?P<gap>[ \t]+)(?P<q>[\"']?)"
        r"(?P<value>[^\s\"'|;&<>()]+)(?P=q)",
        _KEYWORDS,
        ci=True,
        find=_flag,
        anchored=True,
    ),
    _p(
        "assigned_secret",
        rf"<(?P<name>[\w:.\-]{{0,40}}?(?:{_WORDS})[\w:.\-]{{0,40}})(?:\s[^<>]{{0,200}})?>"
        r"(?P<value>[^<>]{1,512})</(?P=name)>",
        _KEYWORDS,
        ci=True,
        find=_element,
    ),
    _p(
        "netrc_password",
        r"\blogin\s+\S+\s+password\s+(?P<value>\S+)",
        ("login",),
        ci=True,
        find=_group_if("value", _not_placeholder),
    ),
    _p(
        "cli_password",
        r"(?:\b(?:(?:docker|podman|helm|oras|skopeo|buildah)\s+(?:registry\s+)?login|sshpass)\b"
        r"[^\n|;&]{0,200}?\s-p[ \t]*|\bmysql(?:dump|admin)?\b[^\n|;&]{0,200}?\s-p)"
        r"(?P<q>['\"]?)(?P<value>[^\s'\"-][^\s'\"]*)(?P=q)",
        ("login", "sshpass", "mysql"),
        ci=True,
        find=_group_if("value", _not_placeholder),
    ),
    _p(
        "high_entropy_secret",
        r"(?:pass|pw|secret|token|key|credential|auth)[^\n]{0,32}?(?<![a-z0-9+/_\-])"
        r"(?P<value>[a-z0-9+/_\-]{20,}={0,2})(?![a-z0-9+/=_\-])",
        _KEYWORDS,
        ci=True,
        find=_group_if("value", _random_token),
        anchored=True,
    ),
)


_WORDS_LOWER = tuple(dict.fromkeys(w for pat in PATTERNS for w in pat.words))
# Each word under every shorter word it contains (`sk-ant-` under `sk`): a text is searched for the longer
# words only if it holds the shorter one.
_WORD_TREE = {
    w: tuple(v for v in _WORDS_LOWER if w in v)
    for w in _WORDS_LOWER
    if not any(v != w and v in w for v in _WORDS_LOWER)
}
_MAX_JSON_DEPTH = 8


@dataclass
class RedactionStats:
    masked: int = 0
    mask_failures: int = 0
    truncated: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Redactor:
    """Masks secrets in strings and nested JSON-like values. Thread-safe; keeps counters."""

    def __init__(
        self, mask: Callable[[str], str] | None = None, *, max_chars: int | None = 65536, mask_keys: bool = True
    ) -> None:
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
        return self._finish(self._scan(text, 0))

    def redact(self, value: Any, *, key: str | None = None) -> Any:
        """Mask a nested value: dicts, lists and tuples are walked, strings scanned, keys checked."""
        if isinstance(value, str):
            return self._by_key(value, key) or self.redact_text(value)
        if isinstance(value, dict):
            return {k: self.redact(v, key=k if isinstance(k, str) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact(v, key=key) for v in value]
        return value

    def _by_key(self, value: str, key: str | None) -> str | None:
        """The masked value when its key names a secret (None: it does not)."""
        if not (self.mask_keys and key is not None and value and _is_secret_key(key)):
            return None
        if _compact(key).endswith("token") and (len(value) < 8 or " " in value):
            return None  # a tokenizer's token (`{"token": "Hi", "logprob": -0.1}`): scanned as text
        if value.startswith(_MARK) and value.endswith("]"):
            return value  # masked already (a value masked twice is counted once)
        self._count("secret_key_name")
        return "[REDACTED:secret_key_name]"

    def _scan(self, text: str, depth: int) -> str:
        """The built-in patterns, and JSON text parsed and masked value by value."""
        if len(text) < 6:
            return text  # shorter than anything a pattern matches (`pw=abc`)
        lowered = _lower(text)
        # case-blind: more than the prefilters, never less
        found = {v for w, longer in _WORD_TREE.items() if w in lowered for v in longer if v in lowered}
        if not found:
            return text  # no pattern can match
        stripped = text.strip()
        if depth < _MAX_JSON_DEPTH and stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
            try:
                parsed = json.loads(stripped)
                if isinstance(parsed, (dict, list)):
                    masked = self._scan_value(parsed, None, depth + 1)
                    return text if masked == parsed else json.dumps(masked, ensure_ascii=False)
            except (ValueError, RecursionError):
                pass  # not JSON (or too deep to walk): scanned as text
        for pat in PATTERNS:  # `found` stays right: masking adds no secrets, only markers
            if not found.isdisjoint(pat.words):
                masked = self._sub(pat, text, lowered if pat.lower else text)
                if masked is not text:
                    text, lowered = masked, _lower(masked)
        return text

    def _scan_value(self, value: Any, key: str | None, depth: int) -> Any:
        if isinstance(value, str):
            return self._by_key(value, key) or self._scan(value, depth)
        if isinstance(value, dict):
            return {k: self._scan_value(v, k if isinstance(k, str) else None, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scan_value(v, key, depth) for v in value]
        return value

    def _sub(self, pat: _Pattern, text: str, where: str) -> str:
        """Replace what `pat` finds in `where` (`text`, or it lower-cased: the same spans) in `text`."""
        parts: list[str] = []
        last = 0
        token = f"[REDACTED:{pat.kind}]"
        for m in _matches(pat, where):
            span = pat.find(m, text) if pat.find is not None else m.span(pat.group)
            if span is None or span[0] < last or span[0] == span[1]:
                continue
            parts += (text[last : span[0]], token)
            last = span[1]
            self._count(pat.kind)
        if not parts:
            return text
        parts.append(text[last:])
        return "".join(parts)

    def _finish(self, text: str) -> str:
        if self.mask is not None:
            try:
                masked = self.mask(text)
                if not isinstance(masked, str):
                    raise TypeError(f"mask returned {type(masked).__name__}, not str")
                text = masked
            except BaseException:  # anything at all (SystemExit too): the whole value goes, capture goes on
                with self._lock:
                    self.stats.mask_failures += 1
                    first = self.stats.mask_failures == 1
                if first:  # once with the traceback; the count is in stats.mask_failures
                    log.warning(
                        "flowrl: the mask callback raised; values it fails on are masked whole "
                        "(further failures are only counted)",
                        exc_info=True,
                    )
                return MASK_FAILED
        return self._truncate(text)

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


def redact_text(text: str) -> str:
    """Mask secrets in one string with the built-in patterns only."""
    return Redactor(max_chars=None).redact_text(text)
