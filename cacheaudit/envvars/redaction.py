"""Redaction: what cacheaudit stores or shows of an environment value holds no credential.

An allowlisted variable can still carry a secret (a Redis URL with a password in a remote-cache
setting, a token pasted into `CPATH` by mistake), so every value the registry returns goes
through `redact`. Names are judged by their parts (`looks_secret_name`), values by the shapes
credentials take (`looks_secret_value`), after ccache's and vLLM's filters
(anchors-ccache-envsnap.md).

Stdlib only; the value pattern is compiled on first use, since a shim process that stores no
value need not pay for it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

REDACTED = "<redacted>"

# Name words: a name part equal to or ending in one of these (MY_TOKEN, GH_OAUTH, DBPASSWORD),
# unlike vLLM's substring filter (secret/token/api/access/password), which would also catch
# DG_JIT_USE_RUNTIME_API and TOKENIZERS_PARALLELISM.
_SECRET_WORD_SUFFIXES = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH",
    "COOKIE", "APIKEY", "ACCESSKEY", "PRIVATEKEY", "SECRETKEY",
)
_SECRET_WORDS = frozenset({
    "SECRETS", "PASSWORDS", "CREDS", "AUTHORIZATION", "SESSION", "SESSIONID",
    "COOKIES", "JWT", "BEARER", "PAT", "OTP",
})
# KEY is a secret word unless the neighbouring part says it is a cache/lookup key or a setting
# about keys (CUPY_CACHE_KEY, TRITON_REDIS_KEY_FORMAT).
_HARMLESS_BEFORE_KEY = frozenset({
    "CACHE", "HASH", "SORT", "PRIMARY", "FOREIGN", "PARTITION", "INDEX", "LOOKUP", "MAP",
    "SHARD", "ROUTING", "GROUP", "DEDUP", "PUBLIC", "HOT", "COMPOSITE",
})
_HARMLESS_AFTER_KEY = frozenset({
    "FORMAT", "PREFIX", "SUFFIX", "LENGTH", "LEN", "SIZE", "BITS", "NAME", "SEP", "SEPARATOR",
    "COLUMN", "FIELD", "TYPE", "ALGORITHM", "ALG",
})
_NAME_SPLIT_RE = re.compile(r"[^A-Z0-9]+")


@functools.lru_cache(maxsize=4096)
def looks_secret_name(name: str) -> bool:
    """Whether a variable's name says its value is a credential (TOKEN, SECRET, API_KEY, ...).

    Works on name parts, so TORCH_CUDA_ARCH_LIST, DG_JIT_PTXAS_CHECK, TOKENIZERS_PARALLELISM,
    GIT_AUTHOR_NAME and PWD stay visible while GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY,
    OPENAI_API_KEY, DB_PASSWORD and GH_OAUTH do not.
    """
    parts = [p for p in _NAME_SPLIT_RE.split(name.upper()) if p]
    for i, part in enumerate(parts):
        if part in _SECRET_WORDS or part.endswith(_SECRET_WORD_SUFFIXES):
            return True
        if part in ("KEY", "KEYS"):
            before = parts[i - 1] if i > 0 else ""
            after = parts[i + 1] if i + 1 < len(parts) else ""
            if before not in _HARMLESS_BEFORE_KEY and after not in _HARMLESS_AFTER_KEY:
                return True
    return False


# A `name=value` pair is secret when the name ends in one of these (API_TOKEN=, X-Amz-Signature=,
# password=): only the value is replaced, so the pattern anchors on the word, not the name's head
# (a lazy scan from the head was quadratic on long PATH-like values).
_KV_NAMES = (
    r"password|passwd|passphrase|token|secret|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|secret[_-]?key|signature|credentials?|auth|sig"
)
_SECRET_VALUE_PATTERN = (
    r"""
      (?P<pem>-----BEGIN[ A-Z0-9]*-----.*?(?:-----END[ A-Z0-9]*-----|\Z))
    | (?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@
    | (?P<authword>\b(?i:bearer|basic)\s+)(?P<authval>[A-Za-z0-9._~+/=-]{8,})
    | (?P<kvkey>(?:(?i:""" + _KV_NAMES + r""")|(?<=[?&;])(?i:key|code))=)
      (?P<kvval>[^&\s#;,'"]+)
    | (?P<tok>
          gh[pousr]_[A-Za-z0-9]{20,}
        | github_pat_[A-Za-z0-9_]{20,}
        | glpat-[A-Za-z0-9_-]{20,}
        | xox[baprs]-[A-Za-z0-9-]{10,}
        | (?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{32,}
        | (?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])
        | (?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}
        | eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*
      )
    """
)


@functools.lru_cache(maxsize=1)
def _secret_value_re() -> re.Pattern[str]:
    # Compiled on first use: ~2 ms that a shim process which stores no value need not pay.
    return re.compile(_SECRET_VALUE_PATTERN, re.VERBOSE | re.DOTALL)


def _replace_secret(match: re.Match[str]) -> str:
    if match.group("scheme") is not None:
        return f"{match.group('scheme')}{REDACTED}@"
    if match.group("authword") is not None:
        word, credential = match.group("authword"), match.group("authval")
        if word[:5].lower() == "basic" and credential.isalpha() and credential.islower():
            return match.group()  # "basic configuration": prose, not a base64 credential
        return f"{word}{REDACTED}"
    if match.group("kvkey") is not None:
        return f"{match.group('kvkey')}{REDACTED}"
    return REDACTED


# Every alternative of the pattern needs one of these literals (or "bearer"/"basic" in any
# case). Checking them with `in` runs at C speed; the regex, which tries each alternative at each
# position, then runs only on the rare value that has one (PATH: ~60 us -> ~2 us).
_SECRET_TRIGGERS = (
    "=", "://", "-----BEGIN", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-",
    "xox", "sk-", "AKIA", "ASIA", "hf_", "eyJ",
)


def _may_hold_secret(value: str) -> bool:
    for trigger in _SECRET_TRIGGERS:
        if trigger in value:
            return True
    lowered = value.lower()
    return "bearer" in lowered or "basic" in lowered


def _redact_value(value: str) -> str:
    if not _may_hold_secret(value):
        return value
    return _secret_value_re().sub(_replace_secret, value)


def looks_secret_value(value: str) -> bool:
    """Whether a value carries a credential of a recognisable shape.

    URLs with user:password@, `Bearer ...`, `password=`/`token=` pairs, GitHub/GitLab/Slack/
    OpenAI-style/AWS/Hugging Face tokens, JWTs and PEM blocks; not paths, flag strings such as
    `-DX=1 -O3`, or 32-hex cache digests.
    """
    return _may_hold_secret(value) and _redact_value(value) != value


def redact(name: str, value: str) -> str:
    """`value` with its secret parts replaced by "<redacted>"; all of it if `name` looks secret.

    A URL keeps its scheme and host and loses only its credentials, so a snapshot still shows
    which remote cache was configured.
    """
    if looks_secret_name(name):
        return REDACTED if value else value
    return _redact_value(value)


def _option_name(word: str) -> str | None:
    """The name of an option word that takes its value in the next word (`--password`,
    `-token`); None for anything else."""
    if not word.startswith("-") or "=" in word or len(word) < 3:
        return None
    return word.lstrip("-")


def redact_word(word: str, after: str | None = None) -> str:
    """One argv word as `redact` would keep it, read as a name and a value where it has them:
    `-DNAME=VALUE` and `-UNAME` (a macro), `--name=VALUE` (an option), `NAME=VALUE`, or the
    value of the option `after` (`--password VALUE`); any other word is judged by the shapes
    of its text alone. The value keeps the word's own redaction rules (`-Xcompiler=-DX=...`)."""
    if after is not None and not word.startswith("-") and looks_secret_name(after):
        return REDACTED if word else word
    name, separator, value = word.partition("=")
    if separator and name:
        if name.startswith("-D") and not name.startswith("--"):
            name = name[2:]
        head = word[:len(word) - len(value)]
        if looks_secret_name(name.lstrip("-")):
            return head + (REDACTED if value else value)
        kept = redact_word(value) if value != word else value
        return head + kept if kept != value else _redact_value(word)
    return _redact_value(word)


def redact_argv(words: Sequence[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A command line with its credentials replaced by "<redacted>" by the rules of `redact`
    (`redact_word`), and the positions of the words that changed: `-DHF_TOKEN=hf_...`,
    `--github-token=ghp_...`, `--password secret`, a token's shape anywhere in a word."""
    kept: list[str] = []
    changed: list[int] = []
    after: str | None = None
    for position, word in enumerate(words):
        shown = redact_word(word, after)
        if shown != word:
            changed.append(position)
        kept.append(shown)
        after = _option_name(word)
    return tuple(kept), tuple(changed)
