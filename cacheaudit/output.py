"""The summary line and the snapshot diff's table. No decisions are made here. The human
output of findings is `cacheaudit.render`'s; of records, explanations, evictions and statistics
`cacheaudit.render_records`'; every JSON document is `cacheaudit.documents`'s.

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
