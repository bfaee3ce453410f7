"""The human output: findings in the style people already read (ruff, pytest), and the formats
that carry them into CI (`--output-format full|concise|markdown|github|sarif`).

One block per finding: its first line `LOCATION: CODE severity message`, LOCATION a path a
person can copy (the changed file, the variable, the entry), then indented evidence lines. The
summary comes last. Lines are wrapped here, between words, and never inside a word: a path
longer than the terminal overflows its line instead of being broken (rich would fold it), so
it can always be copied whole. Findings collapse only when they say exactly the same thing
(`group`); every entry a group concerns is listed, or counted with where the rest are.

Nothing here decides: the findings, counts and records come from the audit. JSON is
`cacheaudit.output`'s.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from cacheaudit.model import Finding

FORMATS = ("full", "concise", "json", "markdown", "github", "sarif")
"""`--output-format` values; `json` is `cacheaudit.output`'s."""
FORMAT_ALIASES = {"table": "full"}
"""Names `--format` accepted before `--output-format` existed."""
COLORS = ("auto", "always", "never")

DOCS_PAGE = "docs/findings/{code}.md"
"""Where a code's page lives in the documentation (`docs` line, SARIF `helpUri`)."""

ENTRIES_SHOWN = 10
"""Entries a collapsed group lists without `--verbose`; the rest are counted and located."""

INDENT = "    "
OVERFLOW_INDENT = INDENT + "  "
"""Where a path too long for the value column starts instead."""
LABEL_WIDTH = 10
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class View:
    """How findings are shown: the format, the width lines wrap at, and how much."""

    format: str = "full"
    width: int = 80
    verbose: bool = False
    quiet: bool = False


def output_format(value: str) -> str:
    """A `--output-format`/`--format` value, its old names accepted; ValueError otherwise."""
    name = FORMAT_ALIASES.get(value, value)
    if name not in FORMATS:
        raise ValueError(f"--output-format must be one of {', '.join(FORMATS)}, not {value!r}")
    return name


def make_console(color: str = "auto", *, stderr: bool = False) -> Console:
    """A console that never wraps inside a line (this module wraps) and colours as asked:
    `auto` leaves it to rich, which honours a terminal, NO_COLOR and FORCE_COLOR."""
    from rich.console import Console

    if color not in COLORS:
        raise ValueError(f"--color must be one of {', '.join(COLORS)}, not {color!r}")
    if color == "always":
        return Console(stderr=stderr, force_terminal=True, soft_wrap=True, highlight=False)
    if color == "never":
        return Console(stderr=stderr, color_system=None, no_color=True, soft_wrap=True,
                       highlight=False)
    return Console(stderr=stderr, soft_wrap=True, highlight=False)


# ------------------------------------------------------------------------------ lines


@dataclass(frozen=True)
class Line:
    """One output line: plain text and the styled spans in it (start, end, rich style)."""

    text: str
    spans: tuple[tuple[int, int, str], ...] = ()

    @property
    def shown(self) -> str:
        return printable(self.text)

    def rich(self) -> Text:
        from rich.text import Text

        styled = Text(self.shown, no_wrap=True, overflow="ignore")
        for start, end, style in self.spans:
            styled.stylize(style, start, end)
        return styled


def printable(text: str) -> str:
    """`text` as a terminal or a UTF-8 file takes it: the bytes of a name that are not UTF-8
    (held as surrogates, as `os.fsdecode` gives them) are shown as `\\xff` escapes instead of
    failing the output."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _printable_data(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(k): _printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_data(v) for v in value]
    return value


def wrap(text: str, width: int, first: str = "", rest: str | None = None) -> list[str]:
    """`first` + `text` wrapped between words at `width`, later lines led by `rest`; a word
    longer than a line (a path) gets a line of its own and overflows it rather than being cut.
    A `first` too long to leave room (a long location) stands alone on its line."""
    rest = first if rest is None else rest
    if not text:
        return [first.rstrip()]
    options = {"break_long_words": False, "break_on_hyphens": False}
    if len(first) > width - 20:
        return [first.rstrip(), *textwrap.wrap(
            text, width=max(width, len(rest) + 20), initial_indent=rest, subsequent_indent=rest,
            **options)]
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest,
                         **options) or [first.rstrip()]


def print_prose(console: Console, markup: str) -> None:
    """Rich markup for a person, wrapped between words to the console's width as the findings
    are (`render.wrap`: a word longer than the line, a path, overflows it whole), its styles
    kept (rich's own wrapping either folds such a word or, told to leave it alone, crops the
    line)."""
    from rich.text import Text

    for paragraph in str(markup).splitlines() or [""]:
        text = Text.from_markup(paragraph)
        plain = text.plain
        indent = " " * (len(plain) - len(plain.lstrip(" ")))  # kept on the lines it wraps onto
        starts, position = [], 0
        for line in wrap(plain.lstrip(" "), max(console.width, 20), indent):
            position = plain.index(line.strip(), position)
            starts.append(position)
        for number, piece in enumerate(text.divide(starts[1:])):
            piece.rstrip()
            console.print(Text(indent) + piece if number else piece, soft_wrap=True)


def evidence(label: str, value: str, width: int, style: str = "") -> list[Line]:
    """`    label     value`, the value wrapped under itself."""
    first = f"{INDENT}{label:<{LABEL_WIDTH}}" if len(label) < LABEL_WIDTH else (
        f"{INDENT}{label} ")
    lines = _fit(wrap(value, width, first, " " * (len(INDENT) + LABEL_WIDTH)), width)
    label_span = (len(INDENT), len(INDENT) + len(label), "dim")
    out = [Line(lines[0], (label_span,) + (((len(first), len(lines[0]), style),) if style
                                           else ()))]
    out += [Line(text, ((0, len(text), style),) if style else ()) for text in lines[1:]]
    return out


def _fit(lines: list[str], width: int) -> list[str]:
    """A word too long for the value column (a path) moves to a line of its own, indented
    less, where that lets it fit the width whole; one that fits nowhere overflows."""
    fitted = []
    for line in lines:
        word = line.split()[-1] if line.strip() else ""
        if len(line) <= width or len(OVERFLOW_INDENT) + len(word) > width:
            fitted.append(line)
            continue
        stem = line[:len(line) - len(word)].rstrip()
        if stem:
            fitted.append(stem)
        fitted.append(OVERFLOW_INDENT + word)
    return fitted


def emit(lines: Iterable[Line], console: Console) -> None:
    for line in lines:
        console.print(line.rich(), soft_wrap=True, highlight=False)


def plain(lines: Iterable[Line]) -> str:
    return "".join(line.shown + "\n" for line in lines)


# ------------------------------------------------------------------------------ groups


@dataclass
class Group:
    """Findings that say exactly the same thing (code, subject, message, evidence), each about
    its own entry: shown once, with every entry and test they concern."""

    finding: Finding
    members: list[Finding] = field(default_factory=list)

    @property
    def entries(self) -> list[str]:
        return list(dict.fromkeys(f.entry for f in self.members if f.entry))

    @property
    def tests(self) -> list[str]:
        return list(dict.fromkeys(t for f in self.members for t in f.tests))


def _generic_hint(finding: Finding) -> str:
    return finding.hint.replace(finding.entry, "{entry}") if finding.entry else finding.hint


def group(findings: Sequence[Finding]) -> list[Group]:
    """Identical findings collapsed (their entries and tests aside), most severe first; a
    finding that differs in anything it says stays on its own."""
    groups: dict[tuple[Any, ...], Group] = {}
    for finding in findings:
        key = (finding.code, finding.subject, finding.message, finding.recorded,
               finding.current, finding.how, finding.inferred, finding.runtime,
               _generic_hint(finding), finding.entry is None)
        groups.setdefault(key, Group(finding)).members.append(finding)
    return sorted(groups.values(), key=lambda g: (-g.finding.severity.rank, g.finding.code,
                                                  g.finding.subject, g.finding.entry or ""))


def location(finding: Finding, entries: Sequence[str] = ()) -> str:
    """What a person would copy to act on the finding: the file it names, the variable, else
    the entry (the entries' common directory for a group)."""
    subject = finding.subject
    if os.path.isabs(subject) or _VARIABLE.match(subject):
        return subject
    entries = list(entries) or ([finding.entry] if finding.entry else [])
    if len(entries) == 1:
        return entries[0]
    if entries:
        return os.path.commonpath(entries)
    if finding.kernel:
        return f"{finding.runtime} kernel {finding.kernel}" if finding.runtime else (
            f"kernel {finding.kernel}")
    return subject or "-"


def _message(finding: Finding, where: str) -> str:
    """The message, led by the subject where the location does not already say it."""
    subject = finding.subject
    if not subject or subject == where or subject in finding.message:
        return finding.message
    return f"{subject}: {finding.message}"


def _docs(code: str) -> str:
    return DOCS_PAGE.format(code=code)


def _hint(group_: Group) -> str:
    """The finding's hint; for a group, about each of its entries (listed above it)."""
    finding = group_.finding
    if len(group_.entries) > 1 and finding.entry:
        return (_generic_hint(finding).replace("the entry ({entry})", "each entry listed")
                .replace("({entry})", "(each entry listed)")
                .replace("{entry}", "each entry listed"))
    return finding.hint


def _entry_lines(entries: Sequence[str], where: str, view: View) -> list[Line]:
    if not entries or entries == [where]:
        return []
    if len(entries) == 1:
        return evidence("entry", entries[0], view.width)
    shown = entries if view.verbose or len(entries) <= ENTRIES_SHOWN + 1 else (
        entries[:ENTRIES_SHOWN])
    lines = evidence("entries", f"{len(entries)}:", view.width)
    lines += [Line(text) for path in shown
              for text in _fit([f"{INDENT}{' ' * LABEL_WIDTH}{path}"], view.width)]
    left = len(entries) - len(shown)
    if left:
        places = sorted({os.path.dirname(path) for path in entries[len(shown):]})
        lines += [Line(text) for text in wrap(
            f"and {left} more in {', '.join(places)} (--verbose lists every one)",
            view.width, INDENT + " " * LABEL_WIDTH)]
    return lines


def finding_block(group_: Group, view: View) -> list[Line]:
    """One finding (or identical findings) as a block: the headline, then the evidence."""
    finding = group_.finding
    entries = group_.entries
    where = location(finding, entries)
    severity = finding.severity.value
    inferred = " (inferred)" if finding.inferred else ""
    head = f"{where}: {finding.code} {severity}{inferred} "
    message = _message(finding, where)
    wrapped = wrap(message, view.width, head, INDENT)
    code_at = len(where) + 2
    spans = ((0, len(where), "bold"),
             (code_at, code_at + len(finding.code) + 1 + len(severity),
              _SEVERITY_STYLE[severity]))
    lines = [Line(wrapped[0], spans)] + [Line(text) for text in wrapped[1:]]
    lines += _entry_lines(entries, where, view)
    if finding.recorded is not None or finding.current is not None:
        lines += evidence("recorded", finding.recorded or "-", view.width)
        lines += evidence("now", finding.current or "-", view.width)
    if finding.how:
        lines += evidence("how", finding.how, view.width)
    if group_.tests:
        lines += evidence("served to", ", ".join(group_.tests), view.width)
    if finding.hint:
        lines += evidence("fix", _hint(group_), view.width, "green")
    lines += evidence("docs", _docs(finding.code), view.width)
    return lines


def concise_line(finding: Finding) -> str:
    """One finding on one line, never wrapped: the entry added where it is not the location."""
    where = location(finding)
    line = f"{where}: {finding.code} {finding.severity.value} {_message(finding, where)}"
    if finding.entry and finding.entry != where:
        line += f" [entry {finding.entry}]"
    return line


# ------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class Totals:
    """What a scan covered, for its summary: entries, roots, and how each entry was judged."""

    entries: int
    roots: int
    tied: int
    reconstructed: int

    @property
    def unverifiable(self) -> int:
        return max(self.entries - self.tied - self.reconstructed, 0)

    def text(self) -> str:
        return (f"scanned {count_text(self.entries, 'entry', 'entries')} in "
                f"{count_text(self.roots, 'cache root')}: {self.tied} tied to a recorded compile, "
                f"{self.reconstructed} judged on inputs reconstructed after the build, "
                f"{self.unverifiable} unverifiable")


def count_text(number: int, one: str, many: str | None = None) -> str:
    return f"{number} {one if number == 1 else (many or one + 's')}"


def verdict(findings: Sequence[Finding]) -> str:
    """`2 errors, 1 warning: 1 CA101, 1 CA202, 1 CA201`, or `no findings`."""
    if not findings:
        return "no findings"
    from cacheaudit.model import FINDING_CODES  # a report without findings never needs it

    severities = Counter(f.severity.value for f in findings)
    codes = Counter(f.code for f in findings)
    by_severity = ", ".join(count_text(severities[s], s) for s in ("error", "warning", "info")
                            if severities[s])
    ordered = sorted(codes, key=lambda c: (-FINDING_CODES[c].severity.rank, c))
    return f"{by_severity}: {', '.join(f'{codes[code]} {code}' for code in ordered)}"


def summary_lines(findings: Sequence[Finding], scope: Sequence[str], view: View) -> list[Line]:
    """The summary, last: the verdict with counts by severity and code, then what was covered."""
    text = f"cacheaudit: {verdict(findings)}"
    worst = max((f.severity for f in findings), key=lambda s: s.rank, default=None)
    style = _SEVERITY_STYLE[worst.value] if worst is not None else "green"
    lines = [Line(t, ((0, len(t), style),)) for t in wrap(text, view.width, "", INDENT)]
    for part in scope:
        lines += [Line(t) for t in wrap(part, view.width, "", INDENT)]
    return lines


# ------------------------------------------------------------------------------ formats


def findings_lines(findings: Sequence[Finding], scope: Sequence[str], view: View) -> list[Line]:
    """`full` or `concise`: the findings (none with `--quiet`), then the summary."""
    lines: list[Line] = []
    if not view.quiet:
        if view.format == "concise":
            lines += [Line(concise_line(f)) for g in group(findings) for f in g.members]
        else:
            for group_ in group(findings):
                lines += finding_block(group_, view)
                lines.append(Line(""))
    return lines + summary_lines(findings, scope, view)


def render(findings: Sequence[Finding], scope: Sequence[str], view: View,
           console: Console) -> None:
    """Findings in `view.format` (not json) on `console`; `--quiet` leaves only the summary,
    and with no findings nothing at all."""
    if view.quiet and not findings:
        return
    if view.format in ("full", "concise"):
        emit(findings_lines(findings, scope, view), console)
        return
    text = {"markdown": markdown, "github": github, "sarif": sarif}[view.format](
        findings, scope, view)
    console.file.write(printable(text))


def markdown(findings: Sequence[Finding], scope: Sequence[str], view: View) -> str:
    """A GitHub job summary or PR comment: the verdict, then one item per finding."""
    lines = ["## cacheaudit", "", f"**{verdict(findings)}**", ""]
    lines += [f"{part}" for part in scope]
    lines.append("")
    if view.quiet:
        return "\n".join(lines)
    for group_ in group(findings):
        finding = group_.finding
        where = location(finding, group_.entries)
        lines.append(f"- **{finding.code}** {finding.severity.value}"
                     f"{' (inferred)' if finding.inferred else ''} `{_md_code(where)}`: "
                     f"{_md(_message(finding, where))}")
        entries = group_.entries
        if entries and entries != [where]:
            lines.append(f"  - {count_text(len(entries), 'entry', 'entries')}:")
            lines += [f"    - `{_md_code(path)}`" for path in entries]
        if finding.recorded is not None or finding.current is not None:
            lines.append(f"  - recorded: {_md(finding.recorded or '-')}")
            lines.append(f"  - now: {_md(finding.current or '-')}")
        if finding.how:
            lines.append(f"  - how: {_md(finding.how)}")
        if group_.tests:
            lines.append(f"  - served to: {_md(', '.join(group_.tests))}")
        if finding.hint:
            lines.append(f"  - fix: {_md(_hint(group_))}")
        # Not a link: relative to a pull request's page it would lead nowhere.
        lines.append(f"  - docs: `{_docs(finding.code)}`")
    lines.append("")
    return "\n".join(lines)


def _md(text: str) -> str:
    """Recorded text inside Markdown prose: markup characters kept literal, one line. An
    underscore inside a word is literal in GitHub's Markdown, and paths stay readable."""
    return re.sub(r"([\\`*\[\]<>|#])", r"\\\1", text).replace("\n", " ")


def _md_code(text: str) -> str:
    return text.replace("`", "'").replace("\n", " ")


_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def _github_data(text: str) -> str:
    """A workflow command's message, escaped as the runner unescapes it."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _github_property(text: str) -> str:
    """A workflow command's property value (file=, title=): ':' and ',' end it unescaped."""
    return _github_data(text).replace(":", "%3A").replace(",", "%2C")


def github(findings: Sequence[Finding], scope: Sequence[str], view: View) -> str:
    """GitHub Actions workflow annotations: `::error file=...,title=CA101 ...::message`, one per
    finding group (a group names all its entries), then the summary as plain lines."""
    out = []
    for group_ in [] if view.quiet else group(findings):
        finding = group_.finding
        where = location(finding, group_.entries)
        details = [_message(finding, where)]
        entries = group_.entries
        if entries and entries != [where]:
            details.append(f"{count_text(len(entries), 'entry', 'entries')}: {', '.join(entries)}")
        if finding.recorded is not None or finding.current is not None:
            details.append(f"recorded {finding.recorded or '-'}, now {finding.current or '-'}")
        if finding.how:
            details.append(f"how: {finding.how}")
        if group_.tests:
            details.append(f"served to: {', '.join(group_.tests)}")
        if finding.hint:
            details.append(f"fix: {_hint(group_)}")
        details.append(f"docs: {_docs(finding.code)}")
        properties = []
        if os.path.isabs(where):
            properties.append(f"file={_github_property(where)}")
        properties.append(f"title={_github_property(f'{finding.code} {finding.name}')}")
        out.append(f"::{_GITHUB_LEVEL[finding.severity.value]} {','.join(properties)}::"
                   f"{_github_data(chr(10).join(details))}")
    out += [f"cacheaudit: {verdict(findings)}", *scope]
    return "\n".join(out) + "\n"


SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _uri(path: str) -> str:
    from pathlib import PurePosixPath

    return PurePosixPath(path).as_uri() if os.path.isabs(path) else path


def sarif_log(findings: Sequence[Finding], scope: Sequence[str] = ()) -> dict[str, Any]:
    """SARIF 2.1.0 for code scanning: one result per finding, located at what changed (the
    header, else the entry; a variable as a logical location), the entry as a related
    location, the rules from the finding codes."""
    from cacheaudit import __version__
    from cacheaudit.model import FINDING_CODES

    codes = sorted(FINDING_CODES)
    rules = [{"id": code, "name": FINDING_CODES[code].name,
              "shortDescription": {"text": FINDING_CODES[code].name},
              "helpUri": _docs(code),
              "defaultConfiguration": {"level": _SARIF_LEVEL[FINDING_CODES[code].severity.value]}}
             for code in codes]
    results = []
    for finding in findings:
        where = location(finding)
        result: dict[str, Any] = {
            "ruleId": finding.code, "ruleIndex": codes.index(finding.code),
            "level": _SARIF_LEVEL[finding.severity.value],
            "message": {"text": _message(finding, where)},
            "properties": {key: value for key, value in (
                ("recorded", finding.recorded), ("now", finding.current), ("how", finding.how),
                ("fix", finding.hint), ("entry", finding.entry), ("runtime", finding.runtime),
                ("kernel", finding.kernel), ("inferred", finding.inferred or None),
                ("tests", list(finding.tests) or None)) if value is not None and value != ""},
        }
        if os.path.isabs(where):
            result["locations"] = [{"physicalLocation": {"artifactLocation": {
                "uri": _uri(where)}}}]
        elif _VARIABLE.match(finding.subject):
            result["locations"] = [{"logicalLocations": [{
                "name": finding.subject, "kind": "variable"}]}]
        if finding.entry and finding.entry != where:
            result["relatedLocations"] = [{"id": 0, "message": {"text": "the cache entry"},
                                           "physicalLocation": {"artifactLocation": {
                                               "uri": _uri(finding.entry)}}}]
        results.append(result)
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "cacheaudit", "version": __version__, "rules": rules}},
        "results": results,
        "properties": {"summary": [f"cacheaudit: {verdict(findings)}", *scope]}}]}


def sarif(findings: Sequence[Finding], scope: Sequence[str], view: View) -> str:
    # URIs carry a name's bytes percent-encoded; text shows them as escapes.
    return json.dumps(_printable_data(sarif_log(findings, scope)), indent=2,
                      ensure_ascii=False) + "\n"

