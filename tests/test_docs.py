"""The documentation keeps up with the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

from cacheaudit.ledger import SCHEMA

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_ledger_doc_holds_the_schema_verbatim():
    text = (DOCS / "ledger.md").read_text()
    match = re.search(r"<!-- schema:begin -->\n```sql\n(.*?)\n```\n<!-- schema:end -->", text,
                      re.DOTALL)
    assert match, "docs/ledger.md lost its schema markers"
    assert match.group(1) == SCHEMA.strip(), (
        "docs/ledger.md is out of date: paste cacheaudit.ledger.SCHEMA between the markers")


def test_docs_link_to_files_that_exist():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
