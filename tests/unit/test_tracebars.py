"""evidence/tracebars.py and the committed bars files (evidence/bars/trace-v<N>.toml): a bars file that lacks a field
or holds a wrong one is an error naming the file and the field; the bars in force for a replay are the newest set
before it for its model; and, read from git, each committed bars file is unchanged since the commit that added it and
judges only replays started after the bars were committed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from evidence import tracebars, tracejudge

ROOT = Path(__file__).resolve().parents[2]
V1 = (ROOT / "evidence" / "bars" / "trace-v1.toml").read_text()


def _write(folder: Path, version: int, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"trace-v{version}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("change, what", [
    (("jct_error_p90 = 0.20", "jct_error_p90 = 20"), r"\[literal\] jct_error_p90 must be a fraction between 0 and 1"),
    (("set_utc = \"2026-11-26T14:37:43Z\"", "set_utc = \"yesterday\""), "set_utc: 'yesterday' is not a UTC instant"),
    (("[literal]", "[literals]"), r"no \[literal\] table"),
    (("version = 1", "version = 3"), "version 3 is not the file's"),
    (("model_fingerprint = ", "fingerprint = "), "no model_fingerprint"),
])
def test_a_wrong_bars_file_is_an_error_naming_the_file_and_the_field(tmp_path, change, what):
    path = _write(tmp_path, 1, V1.replace(*change))
    with pytest.raises(tracebars.BarsError, match=f"^{path}: {what}"):
        tracebars.load(tmp_path)


def test_versions_run_in_order_each_set_after_the_one_before(tmp_path):
    _write(tmp_path, 1, V1)
    path = _write(tmp_path, 2, V1.replace("version = 1", "version = 2"))  # set at the same instant as v1
    with pytest.raises(tracebars.BarsError, match=f"^{path}: set 2026-11-26T14:37:43Z, not after version 1"):
        tracebars.load(tmp_path)
    path.unlink()
    _write(tmp_path, 3, V1.replace("version = 1", "version = 3"))
    with pytest.raises(tracebars.BarsError, match="version 3 where version 2 was expected"):
        tracebars.load(tmp_path)


def test_the_bars_in_force_are_the_newest_of_the_model_set_before_the_replay(tmp_path):
    _write(tmp_path, 1, V1)
    _write(tmp_path, 2, V1.replace("version = 1", "version = 2").replace("2026-11-26T14:37:43Z",
                                                                          "2026-11-28T00:00:00Z"))
    v = tracebars.load(tmp_path)
    model = v[0].model_fingerprint
    assert tracebars.in_force(v, model, datetime(2026, 11, 26, 14, 0, tzinfo=UTC)) is None
    assert tracebars.in_force(v, model, datetime(2026, 11, 27, tzinfo=UTC)).version == 1
    assert tracebars.in_force(v, model, datetime(2026, 11, 29, tzinfo=UTC)).version == 2
    assert tracebars.in_force(v, "0" * 64, datetime(2026, 11, 29, tzinfo=UTC)) is None


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def _history() -> None:
    """Skip (failing in CI) where the checkout has no git history to read."""
    ok = shutil.which("git") and subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                                capture_output=True).returncode == 0
    if not ok:
        if os.environ.get("CI"):
            pytest.fail("CI must check the bars files against git, but the checkout has no git history")
        pytest.skip("no git history in this checkout: the bars files' history cannot be read")


def _committed(version: tracebars.Bars) -> datetime:
    """When the bars were first committed: the commit the file names (first_committed_in), or the one that added
    the file."""
    rel = version.path.relative_to(ROOT).as_posix()
    commit = version.first_committed_in or _git("log", "--diff-filter=A", "--format=%H", "--", rel).split()[-1]
    return datetime.fromtimestamp(int(_git("show", "-s", "--format=%ct", commit).strip()), UTC)


def test_each_committed_bars_file_is_unchanged_since_it_was_added_and_set_before_it_was_committed():
    _history()
    for version in tracebars.load():
        rel = version.path.relative_to(ROOT).as_posix()
        added = _git("log", "--diff-filter=A", "--format=%H", "--", rel).split()
        if not added:  # not committed yet: it is judged when it is
            continue
        assert _git("show", f"{added[-1]}:{rel}") == version.path.read_text(), (
            f"{rel} changed after it was committed: a changed bar is a new version")
        assert version.set_utc <= _committed(version), f"{rel}: set_utc is after the bars were committed"


def test_every_committed_replay_is_judged_by_bars_committed_before_it_started():
    _history()
    versions = tracebars.load()
    for path in sorted((ROOT / "results" / "replay").glob("*.json")):
        from evidence import records

        fingerprint = records.fingerprint_of(path, json.loads(path.read_text()))
        bars = tracebars.in_force(versions, fingerprint, tracejudge.started(path.stem))
        if bars is not None and _git("ls-files", "--", bars.path.relative_to(ROOT).as_posix()).strip():
            assert tracejudge.started(path.stem) >= _committed(bars), (
                f"{path.name} started before {bars.path.name} was committed")
