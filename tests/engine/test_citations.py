"""Every citation of a section names its document (docs/contracts/README.md).

Different files cite different documents (OPS, PD_MTP_FLOW, XPU3_KERNEL_MODEL, SERVICES, docs/design.md, ...), so a
section number on its own is ambiguous. The rule, checked on every tracked text file outside docs/contracts/ (the
contracts' own bare section signs refer to themselves and stay as written):

* Each section sign (U+00A7) must be preceded by a document name, optionally in backticks, then a space:
  `OPS §5.2`, `PD_MTP_FLOW.md §10`, `docs/design.md §4`, `design.md §6`.
* Document names are OPS, PD_MTP_FLOW, XPU3_KERNEL_MODEL, SERVICES and DESIGN (with or without `.md`),
  and any file name ending in `.md`.
* After a named section, further sections of the same document may follow, joined only by separators (", ", "–",
  "-", "/", " and ", " or ", "("): `OPS §5.1–§5.3`, `PD_MTP_FLOW §2, §5`, `SERVICES §5, §6`. Any other word in
  between ends the citation, so the next section needs its name again: `OPS §5.7 rule 1 / OPS §8 C6`.
* A citation may wrap onto the next line: a line break (with the indentation and a leading comment marker `#`,
  `//` or `*`) counts as a space.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = (".py", ".md", ".h", ".cc", ".cpp", ".xpu", ".txt", ".sh", ".toml")
EXCLUDED_DIR = "docs/contracts/"

SECTION = "\u00a7"
_DOC = r"`?(?:\b(?:OPS|PD_MTP_FLOW|XPU3_KERNEL_MODEL|SERVICES|DESIGN)(?:\.md)?|[\w./-]*\w\.md)`?"
_REF = SECTION + r"\s?[0-9A-Za-z][\w.]*"
_SEP = r"\s*(?:,|–|-|/|\band\b|\bor\b|\()\s*"
# The text before a section sign ends with: document name, space(s) or "(", then zero or more "<ref><sep>".
_NAMED = re.compile(_DOC + r"[\s(]*(?:" + _REF + _SEP + r")*\s*$")
_LINE_BREAK = re.compile(r"\s*\n\s*(?:#|//|\*)?\s*")
_LOOKBACK = 300


def _tracked_text_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in listed.stdout.split("\0")
            if p.endswith(EXTENSIONS) and not p.startswith(EXCLUDED_DIR) and (ROOT / p).is_file()]


def bare_citations(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each section sign in `text` not preceded by a document name."""
    found = []
    for match in re.finditer(SECTION, text):
        start = match.start()
        before = _LINE_BREAK.sub(" ", text[max(0, start - _LOOKBACK):start])
        if not _NAMED.search(before):
            line_no = text.count("\n", 0, start) + 1
            line = text.splitlines()[line_no - 1].strip()
            found.append((line_no, line))
    return found


def test_rule_accepts_named_and_rejects_bare_citations():
    s = SECTION
    for ok in (f"OPS {s}5.2", f"see PD_MTP_FLOW {s}2, {s}5", f"(OPS {s}5.1–{s}5.3)", f"`OPS.md` {s}5–{s}7",
               f"docs/design.md {s}4", f"SERVICES {s}5 and {s}6", f"XPU3_KERNEL_MODEL {s}9.2 / {s}9.4",
               f"# per docs/design.md\n# {s}4 above"):
        assert bare_citations(ok) == [], ok
    for bare in (f"{s}3", f"the {s}5.2 checks", f"OPS {s}5.7 rule 1 / {s}8 C6", f"flow spec {s}12.2",
                 f"PD_MTP_FLOW {s}3 row x, {s}5.2"):
        assert len(bare_citations(bare)) == 1, bare


def test_every_section_citation_names_its_document():
    problems = []
    for path in _tracked_text_files():
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        problems += [f"{path}:{line_no}: {line[:160]}" for line_no, line in bare_citations(text)]
    assert not problems, ("section citations without a document name (write e.g. 'PD_MTP_FLOW "
                          + SECTION + "5.2', 'OPS " + SECTION + "3', 'docs/design.md " + SECTION + "4'):\n"
                          + "\n".join(problems))


# Documents a clone does not have, and tracker numbers: a reader of the code cannot follow either.
_UNFOLLOWABLE = re.compile(r"\bRE" r"VIEW\b|\bST" r"YLE\b|\b[Ii]ssue [0-9]+|\bissue item\b")


def test_no_citation_of_a_document_or_issue_a_clone_does_not_have():
    """Comments and docs cite only documents in the repository (docs/, docs/contracts/), never the team's review
    notes, its style guide or issue numbers."""
    problems = []
    for path in _tracked_text_files():
        try:
            lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        problems += [f"{path}:{i}: {line.strip()[:160]}" for i, line in enumerate(lines, 1)
                     if _UNFOLLOWABLE.search(line)]
    assert not problems, "citations a clone cannot follow:\n" + "\n".join(problems)


def test_the_unfollowable_rule_catches_review_style_and_issue_numbers():
    review, style, issue = "RE" + "VIEW", "ST" + "YLE", "iss" + "ue"
    cases = (f"({review} item 7)", f"{style} {SECTION}5.4", f"{issue} 10 item 6", f"{issue.title()} 5")
    assert all(_UNFOLLOWABLE.search(t) for t in cases)
    assert not any(_UNFOLLOWABLE.search(t) for t in ("a review measured", "the issue of ordering", "OPS §5"))
