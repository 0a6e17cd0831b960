"""evidence/report/engine.py (`make report`): the results tables of README.md and docs/*.md are what the committed
records give, byte for byte."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from evidence import records
from evidence.report import bench as report_bench
from evidence.report import engine as report

ROOT = Path(__file__).resolve().parents[2]


RENDERED: dict[str, str] = {}  # the committed records' blocks, rendered once for the tests of this file


def test_the_committed_tables_are_what_the_records_give():
    out = io.StringIO()
    status = report.run(True, out=out, cache=RENDERED)
    assert status == 0, f"run make report and commit what it changes:\n{out.getvalue()}"
    assert "every report block is what the records give" in out.getvalue()


def _tree(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_check_shows_the_difference_and_exits_1_and_a_rebuild_makes_it_pass(tmp_path):
    root = _tree(tmp_path, "# x\n\n<!-- report:cases -->\n| stale |\n<!-- /report:cases -->\n\nafter\n")
    out = io.StringIO()
    assert report.run(check=True, root=root, out=out) == 1
    assert "-| stale |" in out.getvalue() and "README.md differ" not in out.getvalue()
    assert "| stale |" in (root / "README.md").read_text()  # --check writes nothing
    assert report.run(check=False, root=root, out=io.StringIO()) == 0
    text = (root / "README.md").read_text()
    assert text.startswith("# x\n\n<!-- report:cases -->\n| record (fabric) |") and text.endswith(
        "<!-- /report:cases -->\n\nafter\n")
    assert report.run(check=True, root=root, out=io.StringIO()) == 0


@pytest.mark.parametrize("body, message", [
    ("<!-- report:nosuch -->\n<!-- /report:nosuch -->\n", "README.md:2: unknown block report:nosuch"),
    ("<!-- report:cases -->\n| x |\n", "README.md:2: report:cases has no <!-- /report:cases -->"),
    ("<!-- /report:cases -->\n", "README.md:2: <!-- /report:cases --> without its opening mark"),
])
def test_a_bad_mark_is_named_by_file_and_line_and_nothing_is_written(tmp_path, body, message):
    root = _tree(tmp_path, "x\n" + body)
    with pytest.raises(report_bench.ReportError, match=message.replace("(", r"\(")):
        report.run(check=False, root=root)
    assert (root / "README.md").read_text() == "x\n" + body


def test_the_command_exits_2_naming_a_bad_mark(tmp_path, monkeypatch, capsys):
    root = _tree(tmp_path, "<!-- report:nosuch -->\n<!-- /report:nosuch -->\n")
    monkeypatch.setattr(report, "ROOT", root)
    assert report.main([]) == 2
    assert "unknown block report:nosuch" in capsys.readouterr().err


def test_a_mark_inside_prose_is_not_a_block():
    text = "write `<!-- report:NAME -->` marks\n"
    assert report.render(text, "x.md", []) == text


def test_emulated_utilization_is_named_the_compute_fraction_wherever_it_stands():
    """No table calls an emulated GPU's figure GPU utilization: that name is the paper's measured one only."""
    recs = records.load()
    for name, block in report.BLOCKS.items():
        header, *rows = (RENDERED.get(name) or block(recs)).splitlines()
        if name in ("headline", "cases", "sweep"):  # the tables that show the emulated GPUs' figure
            assert report.FRACTION in header, name
        assert "GPU utilization" not in header.replace("measured GPU utilization", ""), (name, header)
        for row in rows:  # in a row, only the paper's figure is a GPU utilization
            assert "GPU utilization" not in row or "407 s → 109 s" in row or "368 s → 140 s" in row, row


def test_only_full_records_make_the_tables(tmp_path):
    """A quick run (one case, one repeat) is a record too, listed, but no result row comes from it."""
    shutil.copy(records.LOSSLESS_FIRST, tmp_path / records.LOSSLESS_FIRST.name)
    import json

    quick = json.loads(records.LOSSLESS_FIRST.read_text())
    quick["points"] = quick["points"][:1]
    quick["settings"]["repeats"] = 1
    (tmp_path / "20270101T000000Z-abcdef0.json").write_text(json.dumps(quick))
    recs = records.load(tmp_path)
    assert len(recs) == 2 and len(report.full(recs)) == 1
    assert report.cases(recs).count("\n| `") == 2  # its two cases, from the full record only
    assert report.records_table(recs).count("\n| `") == 2


def test_the_reconfiguration_rows_carry_the_end_to_end_and_the_event_figures():
    found = report_bench.bench_records("bench_reconfig")
    assert found, "no committed bench_reconfig record under results/bench/"
    for stem, data in found:
        for row in data["results"]:
            assert row["e2e_median_ms"] >= row["total_ms_median"] - 1.0, (stem, row)  # it starts earlier
            assert {"median_ms", "e2e_overhead_median_ms", "programming_in_dark_ms_median"} <= row.keys()
    table = report_bench.reconfig([])
    assert table.count("\n| `") == sum(len(d["results"]) for _, d in found)


def test_a_benchmark_record_that_does_not_parse_is_named(tmp_path):
    (tmp_path / "20260101T000000Z-abc1234-bench_loopback.json").write_text("{")
    with pytest.raises(report_bench.ReportError, match="20260101T000000Z-abc1234-bench_loopback.json: cannot read"):
        report_bench.bench_records("bench_loopback", tmp_path)


def test_the_headline_shows_the_current_model_s_records_once_there_are_any(tmp_path):
    """The README's table: every whole record until one was made with the current model, then only those."""
    import json

    from simulator import identity

    old = json.loads(records.LOSSLESS_FIRST.read_text())
    (tmp_path / "20260101T000000Z-abcdef0.json").write_text(json.dumps(old))
    assert report.headline(records.load(tmp_path)).count("\n| 1 (lossless): `20260101T000000Z-abcdef0`") == 2
    (tmp_path / "20270101T000000Z-1234567.json").write_text(
        json.dumps({**old, "model_fingerprint": identity.fingerprint()}))
    table = report.headline(records.load(tmp_path))
    assert table.count("\n| 1 (lossless): `20270101T000000Z-1234567`") == 2 and "20260101T000000Z-abcdef0" not in table
    # one row per case however many records: a second record of the current model widens the ranges, adds no row
    (tmp_path / "20270102T000000Z-1234567.json").write_text(
        json.dumps({**old, "model_fingerprint": identity.fingerprint()}))
    table = report.headline(records.load(tmp_path))
    assert table.count("\n| 2 (lossless): `20270101T000000Z-1234567` … `20270102T000000Z-1234567`") == 2
    assert "20260101T000000Z-abcdef0" in report.cases(records.load(tmp_path))  # still listed with every record


# Tables that hold no measured figure (what a page offers, where files are, which metrics exist): the only ones
# allowed outside a report block.
NOT_RESULTS = {"| page | what you can do with it |", "| path | what |", "| metric | type | labels | what |",
               "| process | where | why so |", "| probe | what it runs |",
               "| step | what is done | on a new loss meanwhile |"}


def test_every_table_of_figures_in_the_readme_and_docs_is_a_report_block():
    """A results table written by hand cannot be regenerated: each must sit between report marks."""
    loose = []
    for path in report.documents():
        inside, previous = False, ""
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = report.MARK.match(line)
            if m:
                inside = m.group(1) != "/"
            elif line.startswith("|") and not previous.startswith("|") and not inside and line not in NOT_RESULTS:
                loose.append(f"{path.relative_to(report.ROOT)}:{n}: {line[:80]}")
            previous = line
    assert not loose, "tables outside report blocks (make them blocks of scripts/report*.py):\n" + "\n".join(loose)
