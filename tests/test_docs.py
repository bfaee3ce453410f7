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
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_finding_code_has_a_page_that_names_it():
    from cacheaudit.model import FINDING_CODES

    index = (DOCS / "findings" / "README.md").read_text()
    for code, finding in FINDING_CODES.items():
        page = (DOCS / "findings" / f"{code}.md").read_text()
        assert page.startswith(f"# {code}: {finding.name}\n"), code
        for section in ("## What it means", "## How it is established", "## What to do"):
            assert section in page, (code, section)
        assert f"[{code}]({code}.md)" in index
    assert {p.stem for p in (DOCS / "findings").glob("CA*.md")} == set(FINDING_CODES)


def test_every_hint_is_for_a_known_code():
    from cacheaudit.findings import HINTS
    from cacheaudit.model import FINDING_CODES

    assert set(HINTS) <= set(FINDING_CODES)


def _schema_members(spec: object, found: set[str]) -> set[str]:
    """Every member name an object of the schema lists, however deep."""
    if isinstance(spec, dict):
        found.update(spec.get("properties", {}))
        for value in spec.values():
            _schema_members(value, found)
    elif isinstance(spec, list):
        for value in spec:
            _schema_members(value, found)
    return found


def test_json_doc_names_every_kind_and_every_member_the_schema_lists():
    from cacheaudit import contract

    text = (DOCS / "json.md").read_text()
    for kind, version in contract.VERSIONS.items():
        assert re.search(rf"\| `cacheaudit/{re.escape(kind)}` \| {version} \|", text), (
            f"docs/json.md's table of kinds lacks cacheaudit/{kind} at version {version}")
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    named = {word for code in re.findall(r"`([^`]+)`", prose)
             for word in re.findall(r"[A-Za-z_][\w-]*", code)}
    members = _schema_members(contract.schema()["$defs"], set())
    assert sorted(members - named) == [], "members of the shipped schema docs/json.md never names"
