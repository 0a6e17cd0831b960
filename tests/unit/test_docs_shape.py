"""The docs keep their shape: a page per subject under 400 lines, a README results table of one row per case (each
record's own row is in docs/results.md), and every link into the glossary lands on one of its words."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from evidence.report import engine as report
from simulator.inputs.cases import CASES

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_LINES = 400


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_a_page_is_under_400_lines(page: Path):
    n = len(page.read_text().splitlines())
    assert n <= MAX_LINES, f"{_rel(page)} has {n} lines (at most {MAX_LINES}): split it by subject"


def _tables(text: str) -> list[list[str]]:
    """Each markdown table's body rows (after the header and its --- line)."""
    out, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            out.append([r for r in rows[2:]])
            rows = []
    return out


def readme_result_rows(text: str) -> list[int]:
    """The number of body rows of each table inside a report block of `text`."""
    counts = []
    for m in re.finditer(r"^<!-- report:([\w-]+) -->$(.*?)^<!-- /report:\1 -->$", text, re.M | re.S):
        counts += [len(t) for t in _tables(m.group(2))]
    return counts


def test_the_readme_results_table_has_one_row_per_case():
    text = (ROOT / "README.md").read_text()
    assert "<!-- report:headline -->" in text
    counts = readme_result_rows(text)
    assert counts, "no results table in the README's report blocks"
    assert all(n <= len(CASES) for n in counts), (
        f"a README results table has {max(counts)} rows (at most one per case, {len(CASES)}): the per-record "
        "table belongs in docs/results.md (the cases block)")


def test_the_check_can_fail():
    """A table of one row per record, as the README had, is caught; the cases block in docs/results.md has it."""
    records = report.full(report.current(report.rec.load()))
    table = report.cases(records)
    assert len(records) > 1 and max(readme_result_rows(f"<!-- report:cases -->\n{table}\n<!-- /report:cases -->\n")) \
        > len(CASES)
    assert "<!-- report:cases -->" in (ROOT / "docs" / "results.md").read_text()
    assert max(len(t) for t in _tables("x\n" + "\n".join(["| a |", "| --- |"] + ["| 1 |"] * 401))) == 401


GLOSSARY = ROOT / "docs" / "glossary.md"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_into_the_glossary_lands_on_a_word():
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", GLOSSARY.read_text(), re.M)}
    bad = []
    for page in PAGES:
        for anchor in re.findall(r"glossary\.md#([\w-]+)", page.read_text()):
            if anchor not in anchors:
                bad.append(f"{_rel(page)}: glossary.md#{anchor}")
    assert not bad, "links to no word of docs/glossary.md:\n" + "\n".join(bad)
    assert "docs/glossary.md" in (ROOT / "README.md").read_text()  # in the documentation table


@pytest.mark.parametrize("word", ["RoCE", "PFC", "MEMS", "job of concern", "job beside", "NIC at home", "pp", "held"])
def test_the_words_the_newcomer_missed_are_defined(word):
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", GLOSSARY.read_text(), re.M)}
    assert _anchor(word) in anchors
