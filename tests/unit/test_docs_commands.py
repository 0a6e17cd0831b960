"""The docs cannot name a flag or a target that does not exist.

Every invocation of the project's own commands in README.md and docs/*.md — in fenced shell blocks and in inline code
spans — is checked against the real parsers: `optirack…`, `python -m …`, `python scripts/…` and `scripts/…` by
running the command's `--help` (the subcommand's, where one is named) and finding each `--flag` of the invocation in
it; `make …` by `make -n` (the targets must exist), and the options a Makefile variable such as `ARGS` passes on by
the same `--help` check of the command that `make -n` prints with them. Nothing is run but `--help` and `make -n`.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv the tests run in: its entry points are the project's
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ENTRY_POINTS = ("optirack", "optirack-rack", "optirack-controller", "optirack-worker")
PYTHONS = ("python", "python3")
SEPARATORS = {"&", "&&", ";", "|", "||"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^```(\w*)\s*$")
INLINE = re.compile(r"`([^`\n]+)`")
# An inline code span is an invocation only when it starts like one (a span such as `optirack.job` or
# `scripts/stats.py` names a thing, not a command).
INLINE_START = re.compile(
    r"^(make [A-Za-z]|(\.venv/bin/)?optirack(-rack|-controller|-worker)?( |$)"
    r"|(\.venv/bin/)?python3? (-m [\w.]|scripts/\w)|scripts/\S+\.sh( |$))"
)


@dataclass(frozen=True)
class Invocation:
    where: str  # file:line
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def _commands(text: str) -> list[list[str]]:
    """The simple commands of one shell line (comments dropped, split at & && ; | ||, assignments before a command
    dropped); an empty list where the line does not parse as shell."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="&;|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    out, cur = [], []
    for t in tokens + [";"]:
        if t in SEPARATORS:
            while cur and ASSIGNMENT.match(cur[0]):
                cur = cur[1:]
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out


def _ours(argv: list[str]) -> bool:
    head = argv[0].removeprefix(".venv/bin/")
    if head in ENTRY_POINTS or head == "make":
        return True
    if head in PYTHONS and len(argv) > 1:
        return argv[1] == "-m" or argv[1].startswith("scripts/")
    return head.startswith("scripts/")


def invocations_in(path: Path, text: str) -> list[Invocation]:
    """Every invocation of our commands in one Markdown text."""
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found: list[Invocation] = []
    lines = text.split("\n")
    fence: str | None = None
    pending, start = "", 0
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line.strip())
        if m:
            fence = None if fence is not None else m.group(1)
            continue
        if fence is not None:
            if fence not in ("", "sh", "bash", "shell", "console"):
                continue
            if not pending:
                start = n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            shell, pending = pending + line, ""
            found += [Invocation(f"{rel}:{start}", tuple(c)) for c in _commands(shell) if _ours(c)]
        else:
            for span in INLINE.findall(line):
                if INLINE_START.match(span):
                    found += [Invocation(f"{rel}:{n}", tuple(c)) for c in _commands(span) if _ours(c)]
    return found


def all_invocations() -> list[Invocation]:
    return [i for doc in DOCS for i in invocations_in(doc, doc.read_text())]


def _resolve(argv: tuple[str, ...]) -> list[str]:
    """argv with our entry points and python taken from the test's virtualenv."""
    head = argv[0].removeprefix(".venv/bin/")
    if head in ENTRY_POINTS:
        return [str(BIN / head), *argv[1:]]
    if head in PYTHONS:
        return [sys.executable, *argv[1:]]
    return [str(ROOT / argv[0]), *argv[1:]]


def _subcommand_prefix(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The command and its words up to the first option: `optirack circuits --set a=b` -> `optirack circuits`;
    `python -m pytest tests/x.py -q` -> `python -m pytest tests/x.py`."""
    head = argv[0].removeprefix(".venv/bin/")
    skip = 3 if head in PYTHONS and argv[1] == "-m" else 1
    out = list(argv[:skip])
    for word in argv[skip:]:
        if word.startswith("-"):
            break
        out.append(word)
    return tuple(out)


@functools.cache
def help_text(prefix: tuple[str, ...]) -> str:
    """What `PREFIX --help` prints; AssertionError naming the command if it does not print a usage."""
    cmd = [*_resolve(prefix), "--help"]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise AssertionError(f"`{shlex.join(prefix)}`: no such command ({cmd[0]})") from None
    out = r.stdout + r.stderr
    if r.returncode != 0 or "usage" not in out.lower():
        raise AssertionError(f"`{shlex.join(prefix)} --help` exited {r.returncode} without a usage:\n{out[-2000:]}")
    return out


def _flags(argv: tuple[str, ...]) -> list[str]:
    return [w.split("=", 1)[0] for w in argv if re.match(r"^--[A-Za-z0-9][\w-]*", w)]


def check_cli(argv: tuple[str, ...]) -> None:
    text = help_text(_subcommand_prefix(argv))
    missing = [f for f in _flags(argv) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    parser = shlex.join(_subcommand_prefix(argv))
    assert not missing, f"`{shlex.join(argv)}`: {', '.join(missing)} not in `{parser} --help`"


def check_make(argv: tuple[str, ...]) -> None:
    args = list(argv[1:])
    assignments = [a for a in args if ASSIGNMENT.match(a)]
    r = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"`{shlex.join(argv)}`: make -n exited {r.returncode}: {r.stderr.strip()[-500:]}"
    # What a variable passes on reaches a command: check its options against that command's parser.
    for a in assignments:
        value = a.split("=", 1)[1]
        if not _flags((value,)) and not value.startswith("--"):
            continue
        lines = [ln for ln in r.stdout.splitlines() if value in ln]
        assert lines, f"`{shlex.join(argv)}`: make -n printed no command with {value!r}"
        for line in lines:
            for cmd in _commands(line):
                cmd[0] = cmd[0].replace(str(ROOT) + "/", "")
                if Path(cmd[0]).name in ENTRY_POINTS:
                    cmd[0] = Path(cmd[0]).name
                elif Path(cmd[0]).name.startswith("python"):
                    cmd[0] = "python"
                if _ours(cmd) and cmd[0] != "make":
                    check_cli(tuple(cmd))


def check(inv: Invocation) -> None:
    if inv.argv[0] == "make":
        check_make(inv.argv)
    else:
        check_cli(inv.argv)


INVOCATIONS = all_invocations()


@pytest.fixture(scope="module", autouse=True)
def _helps_at_once():
    """Every `--help` the checks need, run four at a time (each imports its package: about 0.5 s)."""
    from concurrent.futures import ThreadPoolExecutor

    prefixes = {_subcommand_prefix(i.argv) for i in INVOCATIONS if i.argv[0] != "make"}

    def fetch(prefix):
        try:
            help_text(prefix)
        except AssertionError:
            pass  # the test of that invocation says so

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(fetch, prefixes))


def test_the_docs_have_the_two_commands_and_many_more():
    """The collector finds what it must (so an empty collection cannot pass the test below)."""
    argvs = {i.argv for i in INVOCATIONS}
    assert ("make", "demo") in argvs and ("make", "test") in argvs
    assert len(INVOCATIONS) >= 40
    assert {Path(i.where.split(":")[0]).name for i in INVOCATIONS} >= {"README.md", "jobs.md", "simulator.md"}


@pytest.mark.parametrize("inv", INVOCATIONS, ids=str)
def test_every_documented_command_parses(inv: Invocation):
    check(inv)


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ("```sh\noptirack simulate --gpus 64 --no-such-flag 3\n```", "--no-such-flag not in"),
        ("Run `optirack frobnicate --now` to frob.", "without a usage"),
        ("```sh\nmake no-such-target\n```", "make -n exited"),
        ('```sh\nmake demo ARGS="--quick --fitt"   # a typo\n```', "--fitt not in"),
        ("```sh\n.venv/bin/python scripts/bench_store.py \\\n    --no-such-option\n```", "--no-such-option not in"),
    ],
)
def test_a_wrong_command_in_the_docs_fails(doc: str, why: str):
    invs = invocations_in(ROOT / "docs" / "example.md", doc)
    assert len(invs) == 1
    with pytest.raises(AssertionError, match=re.escape(why)):
        check(invs[0])


def test_the_collector_reads_shell_as_shell():
    invs = invocations_in(
        ROOT / "x.md",
        "```sh\nURL=http://x make rack-up TOPO=t.yaml && optirack jobs # optirack stop\n"
        "optirack submit \\\n  --gpus 4 &\ndocker ps\n```\n```yaml\nmake: no\n```",
    )
    assert [i.argv for i in invs] == [
        ("make", "rack-up", "TOPO=t.yaml"),
        ("optirack", "jobs"),
        ("optirack", "submit", "--gpus", "4"),
    ]
    assert [i.where for i in invs] == ["x.md:2", "x.md:2", "x.md:3"]
