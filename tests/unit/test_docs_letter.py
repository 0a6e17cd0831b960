"""The docs and the commands' help say nothing a reader cannot follow: no tracker number ("issue 35", "#25": the
tracker is not the repository's), and no link to a file the repository does not hold.

The help is read from the source (every help=, description= and epilog= string of an argument parser, and a module
docstring a parser shows), so that no command has to be started."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = ("controller", "emulation", "evidence", "profiles", "scripts", "simulator", "containers")
TRACKER = re.compile(r"\b[Ii]ssues? #?\d+\b|(?<![\w&/#-])#\d+\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def tracker_numbers(text: str) -> list[str]:
    """The tracker numbers in `text`, link targets left out (an anchor such as `page.md#4096-gpus` is not one)."""
    return TRACKER.findall(LINK.sub("[]", text))


@pytest.mark.parametrize(("text", "found"), [
    ("as issue 35 says", ["issue 35"]), ("the papers #25 cites", ["#25"]), ("Issues #3", ["Issues #3"]),
    ("[4,096 GPUs](simulator-scale.md#4096-gpus)", []), ("16,384 GPUs, rank #0", ["#0"]), ("a #define", []),
])
def test_the_check_finds_tracker_numbers_and_only_them(text, found):
    assert tracker_numbers(text) == found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_a_tracker_number(page: Path):
    found = [f"{i}: {n}" for i, line in enumerate(page.read_text().splitlines(), 1) for n in tracker_numbers(line)]
    assert not found, f"{page.relative_to(ROOT)} cites the tracker (cite what it says instead): {found}"


def _help_strings(path: Path) -> list[tuple[int, str]]:
    """The text of an argument parser's help in a module: help=, description=, epilog= and usage= values, and the
    module's docstring where a parser shows it (description=__doc__ ...)."""
    tree = ast.parse(path.read_text())
    out, shows_doc = [], False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("help", "description", "epilog", "usage"):
                    text = ast.unparse(kw.value)
                    shows_doc |= any(isinstance(n, ast.Name) and n.id == "__doc__" for n in ast.walk(kw.value))
                    out.append((kw.value.lineno, text))
    doc = ast.get_docstring(tree)
    if shows_doc and doc:
        out.append((1, doc))
    return out


def _modules() -> list[Path]:
    return [p for pkg in CODE for p in sorted((ROOT / pkg).rglob("*.py")) if "__pycache__" not in p.parts]


def test_no_help_cites_a_tracker_number():
    found = [f"{p.relative_to(ROOT)}:{line}: {n}" for p in _modules() for line, text in _help_strings(p)
             for n in tracker_numbers(text)]
    assert not found, "--help text cites the tracker:\n" + "\n".join(found)


def test_the_help_check_reads_help_and_the_docstring_a_parser_shows(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Made for issue 7."""\nimport argparse\np = argparse.ArgumentParser(description=__doc__)\n'
                      'p.add_argument("--x", help="see #12")\n')
    assert [n for _, t in _help_strings(module) for n in tracker_numbers(t)] == ["#12", "issue 7"]


HOST_TOOL = re.compile(r"\bolock\b")  # this shared development host's lock tool: no fresh machine has it


def test_no_page_or_help_tells_a_reader_to_run_a_tool_only_our_host_has():
    """A newcomer's machine has no `olock`: a page, a command's help or a report block's text that says to run
    one is a step they cannot take (say "with nothing else running" instead)."""
    found = [f"{page.relative_to(ROOT)}:{i}" for page in PAGES
             for i, line in enumerate(page.read_text().splitlines(), 1) if HOST_TOOL.search(line)]
    found += [f"{p.relative_to(ROOT)}:{line}" for p in _modules() for line, text in _help_strings(p)
              if HOST_TOOL.search(text)]
    report = ROOT / "evidence" / "report"
    found += [f"{p.relative_to(ROOT)}:{i}" for p in sorted(report.glob("*.py"))
              for i, line in enumerate(p.read_text().splitlines(), 1) if HOST_TOOL.search(line)]
    assert not found, "tells the reader to run olock, which only this host has:\n" + "\n".join(found)


def _tracked() -> set[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60)
    files = {f for f in out.stdout.decode().split("\0") if f}
    return files | {str(Path(f).parent) for f in files} | {str(p) for f in files for p in Path(f).parents}


def broken_links(text: str, folder: Path, tracked: set[str]) -> list[str]:
    """The links of a page in `folder` to a file or folder of the repository that git does not hold."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address, or a place on this page
        path = (folder / target.split("#")[0]).resolve()
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else None
        if rel is None or rel not in tracked:
            out.append(target)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_file_lands_on_one_the_repository_holds(page: Path):
    broken = broken_links(page.read_text(), page.parent, _tracked())
    assert not broken, f"{page.relative_to(ROOT)} links to files not in the repository: {broken}"


def test_the_link_check_can_fail():
    tracked = _tracked()
    text = "[a](results.md) [b](../results/records/) [c](missing.md#x) [d](https://example.org/x) [e](#here)"
    assert broken_links(text, ROOT / "docs", tracked) == ["missing.md#x"]
