"""The summary line, the snapshot diff's table, and `evict`'s and `stats`' lines. No decisions
are made here. The human output of findings, records and explanations is `cacheaudit.render`'s;
every JSON document is `cacheaudit.documents`'s.

Everything recorded (test ids, argv tokens, paths, messages) goes through `_e` before it meets
rich markup: `test_k[fp16-128]` must keep its brackets and `-DTAG=[/x]` must not be read as a
closing tag.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit.model import Finding

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit.audit.evict import EvictResult
    from cacheaudit.audit.stats import Stats, Tally


def escape_markup(value: object) -> str:
    """Recorded text as literal rich markup."""
    from rich.markup import escape

    return escape(str(value))


_e = escape_markup


# ------------------------------------------------------------------------------------ findings

def summary_line(scanned: int, roots: int, matched: int, reconstructed: int,
                 findings: Sequence[Finding]) -> str:
    counts = Counter(f.severity.value for f in findings)
    verdict = ", ".join(f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}"
                        for s in ("error", "warning", "info") if counts[s]) or "no findings"
    untied = max(scanned - matched - reconstructed, 0)
    return (f"{scanned} entr{'y' if scanned == 1 else 'ies'} in {roots} cache "
            f"root{'' if roots == 1 else 's'} ({matched} tied to an observed compile, "
            f"{reconstructed} judged on inputs reconstructed after the build, {untied} "
            f"unverified): {verdict}")


# ------------------------------------------------------------------------------------ snapshots


def render_snapshot_diff(groups: Mapping[str, Sequence[Mapping[str, Any]]],
                         console: Console) -> None:
    from rich.table import Table

    changed = {name: rows for name, rows in groups.items() if rows}
    if not changed:
        console.print("no differences")
        return
    for name, rows in changed.items():
        table = Table(title=f"{_e(name)} ({len(rows)})", title_justify="left")
        for column in ("item", "field", "before", "after"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(_e(row["item"]), _e(row["field"]), _e(_plain(row["before"])),
                          _e(_plain(row["after"])))
        console.print(table)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# ------------------------------------------------------------------------------ evict, stats
# Plain lines, one fact each and every path whole on its line: nothing here wraps at 80 columns.


def _utc(ns: int | None) -> str:
    import datetime

    if ns is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def evict_lines(result: EvictResult) -> list[str]:
    """`cacheaudit evict`: a line per chosen entry (`STATUS PATH: CODE subject`, the reason
    indented below for a skipped or failed one), then the summary."""
    lines = [] if result.scan.roots else ["no cache roots found"]
    for outcome in result.outcomes:
        deciding = outcome.deciding
        codes = sorted({f.code for f in outcome.findings})
        more = f" (+{', '.join(c for c in codes if c != deciding.code)})" if len(codes) > 1 \
            else ""
        verb = outcome.status.replace("-", " ")
        lines.append(f"{verb} {outcome.entry.path}: {deciding.code} {deciding.subject}{more}")
        if outcome.reason:
            lines.append(f"  why: {outcome.reason}")
    lines.append(result.summary())
    return lines


def stats_lines(stats: Stats) -> list[str]:
    """`cacheaudit stats`: a block per runtime and root, then the total where there are
    several."""
    def block(tally: Tally, title: str) -> list[str]:
        rate = "-" if tally.hit_rate is None else f"{tally.hit_rate:.1%}"
        marked = (f" ({tally.disk_hits_unrecorded} seen by a hit marker)"
                  if tally.disk_hits_unrecorded else "")
        judged = (f"stale {tally.stale}, unverifiable {tally.unverifiable}"
                  if tally.stale is not None else "stale and unverifiable: not judged (--no-scan)")
        return [title,
                f"  entries {tally.entries}, {tally.bytes} bytes; oldest {_utc(tally.oldest_ns)}, "
                f"newest {_utc(tally.newest_ns)}",
                f"  compiles {tally.compiles}, disk hits {tally.disk_hits}{marked}, memory hits "
                f"{tally.memory_hits}, hit rate {rate}",
                f"  {judged}, evicted {tally.evicted}"]

    lines: list[str] = []
    for tally in stats.tallies:
        lines += block(tally, f"{tally.runtime} {tally.root}")
    if not stats.tallies:
        lines.append("no cache roots found")
    if len(stats.tallies) > 1:
        lines += block(stats.total(), f"total: {len(stats.tallies)} runtime root(s)")
    return lines
