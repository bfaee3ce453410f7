"""What the ledger keeps of a command line: credentials redacted, by the environment's rules.

A compile's argv (`-DHF_TOKEN=hf_...`), the command of the process that ran it
(`train.py --github-token=ghp_...`) and a recording note can carry a credential as plainly as
an environment variable, and the ledger and its spool are files that outlive the job. Every
word goes through `envvars.redact_argv` (which judges names and values with `envvars.redact`)
before it is sealed or stored; the record keeps which argv positions changed
(`CompileRecord.redacted_argv`), so that nothing reruns a command that is not the one that ran.

`CACHEAUDIT_REDACT_ARGV=0` (or `redact-argv = false` in `[tool.cacheaudit]`, which a recording
session exports as that variable) keeps command lines verbatim; docs/security.md.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping, Sequence

from cacheaudit.envvars import redaction
from cacheaudit.ledger.values import RunInfo
from cacheaudit.model import ArgToken, CompileRecord
from cacheaudit.switches import REDACT_ARGV as REDACT_ARGV_VARIABLE


def argv_redaction(env: Mapping[str, str] | None = None) -> bool:
    """Whether command lines are redacted under `env` (the process's environment by default)."""
    value = (os.environ if env is None else env).get(REDACT_ARGV_VARIABLE, "")
    return value.strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=4096)
def _redacted_argv(words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    # Records written by the batch share their command lines: each is judged once.
    return redaction.redact_argv(words)


@functools.lru_cache(maxsize=4096)
def _redacted_tokens(tokens: tuple[ArgToken, ...]) -> tuple[ArgToken, ...]:
    # The effective argv, by the rules of argv: records of a batch share their flags.
    texts, _ = _redacted_argv(tuple(t.text for t in tokens))
    return tuple(t if t.text == text else ArgToken(text, t.origin)
                 for t, text in zip(tokens, texts, strict=True))


@functools.lru_cache(maxsize=4096)
def _redacted_text(text: str) -> str:
    return redaction.redact("", text)


def redact_record(record: CompileRecord, env: Mapping[str, str] | None = None) -> CompileRecord:
    """`record` as the ledger keeps it: argv, effective argv and notes redacted, the redacted
    argv positions added to those already marked. The same record when nothing changed."""
    if not argv_redaction(env):
        return record
    return _redacted_record(record)


_SharedTokens = dict[int, tuple[tuple[ArgToken, ...], tuple[ArgToken, ...]]]


def redact_records(records: Iterable[CompileRecord], env: Mapping[str, str] | None = None
                   ) -> list[CompileRecord]:
    """`redact_record` of each of `records`, the setting read once for them all: a batch of a
    hundred thousand records would otherwise read the environment as many times."""
    if not argv_redaction(env):
        return list(records)
    # Records of a batch often share their effective argv's very tuple (an observer's flags):
    # it is redacted once by identity, not hashed token by token (`ArgToken.__hash__` is
    # Python) for every record. Each entry holds its tuple, so that no id is reused meanwhile.
    shared: _SharedTokens = {}
    return [_redacted_record(record, shared) for record in records]


def _redacted_record(record: CompileRecord, shared: _SharedTokens | None = None
                     ) -> CompileRecord:
    if (not record.argv and not record.effective_argv and not record.notes
            and record.runtime_error is None and record.graph_problem is None):
        # Nothing that could hold a credential: most records of a batch (disk hits).
        return record
    argv, changed = _redacted_argv(tuple(record.argv))
    tokens = record.effective_argv
    # Only a tuple is shared by identity: a list could change between two records.
    if type(tokens) is not tuple:
        shared = None
    known = shared.get(id(tokens)) if shared is not None else None
    if known is not None and known[0] is tokens:
        effective = known[1]
    else:
        effective = _redacted_tokens(tuple(tokens))
        if shared is not None:
            shared[id(tokens)] = (tokens, effective)
    notes = tuple(_redacted_text(note) for note in record.notes)
    # Messages that may quote a command: the runtime's refusal, why there is no graph.
    messages = {name: _redacted_text(value) for name in ("runtime_error", "graph_problem")
                if (value := getattr(record, name)) is not None}
    if not changed and effective == record.effective_argv and notes == record.notes and all(
            getattr(record, name) == value for name, value in messages.items()):
        return record
    marked = tuple(sorted(set(record.redacted_argv) | set(changed)))
    return dataclasses.replace(record, argv=argv, effective_argv=effective, notes=notes,
                               redacted_argv=marked, **messages)


def redact_command(command: Sequence[str], env: Mapping[str, str] | None = None
                   ) -> tuple[str, ...]:
    """A command line as cacheaudit keeps or shows it (a run's command, `run --report-json`)."""
    if not argv_redaction(env):
        return tuple(command)
    return redaction.redact_argv(command)[0]


def redact_run(run: RunInfo, env: Mapping[str, str] | None = None) -> RunInfo:
    """`run` with its command redacted (the runtime's process: `python train.py --token ...`)."""
    if run.command is None:
        return run
    command = redact_command(run.command, env)
    return dataclasses.replace(run, command=command) if command != run.command else run
