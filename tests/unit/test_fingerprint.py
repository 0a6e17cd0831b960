"""evidence/fingerprint.py: the model known by its predictions on the probe set (evidence/probes.py)."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evidence import fingerprint, modelhash, probes, records
from simulator import identity

ROOT = Path(__file__).resolve().parents[2]
MODEL = modelhash.MODEL_FILES + modelhash.MORE_MODEL
# imported by the model but predicting nothing: a run's figures (simulator/model/neighbours.py tabulates MLTCP's gain)
NOT_MODEL = {"simulator/studies/metrics.py"}


def _has_code(path: Path) -> bool:
    """Whether a module defines a function (a module of data only runs when it is imported)."""
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(ast.parse(path.read_text())))


def test_the_probe_set_runs_every_model_module_and_its_fingerprint_is_the_committed_one():
    """Every module of the model has a function run by the probes (imports are done before the tracer starts, so
    a module's import does not count); the fingerprint the probes give is simulator/fingerprint.json's."""
    code = ("import sys, simulator.model.fidelity, simulator.model.tracesim, simulator.model.engine, "
            "simulator.model.neighbours, simulator.inputs.racks, controller.core.rackgen; "
            "print('\\n'.join(m.__file__ for n, m in list(sys.modules.items()) if (n.split('.')[0] in "
            "('simulator', 'profiles') or n.startswith('controller.core.')) and getattr(m, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    imported = {str(Path(f).resolve().relative_to(ROOT)) for f in out.split()} - NOT_MODEL
    imported = {f for f in imported if not (f.startswith("simulator/") and f.endswith("__init__.py"))}  # packages
    assert imported - set(MODEL) == set(), "a module the model imports is not in modelhash.MODEL_FILES/MORE_MODEL"
    for name in probes.MODULES:
        probes.module(name)
    seen: set[str] = set()

    def tracer(frame, event, arg):
        if frame.f_code.co_name != "<module>":
            seen.add(frame.f_code.co_filename)

    fingerprint.computed.cache_clear()
    sys.settrace(tracer)
    try:
        got = fingerprint.computed()
    finally:
        sys.settrace(None)
    not_run = [f for f in MODEL if str(ROOT / f) not in seen and _has_code(ROOT / f)]
    assert not not_run, f"no line of these model modules ran in the probe set: {not_run}"
    committed = json.loads(identity.FINGERPRINT.read_text())
    moved = [name for name, h in got["probes"].items() if committed["probes"].get(name) != h]
    assert got["fingerprint"] == identity.fingerprint(), (
        f"the model's predictions moved (probes {moved}): if that is meant, `python -m evidence.fingerprint "
        "--write` and commit simulator/fingerprint.json; the records made before then check the model no more")


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory) -> Path:
    """A copy of the model's packages, to change."""
    tree = tmp_path_factory.mktemp("model")
    for package in ("controller", "profiles", "simulator"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} is not there once"
    path.write_text(text.replace(old, new))


def test_a_pure_refactor_keeps_the_fingerprint(model_copy):
    """Limits moved out of interference.py into a module of its own, dark_time renamed where the engine calls it:
    the same predictions, the same fingerprint (computed in another process, on the copy)."""
    inter = model_copy / "simulator" / "model" / "interference.py"
    text = inter.read_text()
    start, end = text.index("@dataclass(frozen=True)\nclass Limits:"), text.index("@dataclass\nclass _Fluid:")
    (model_copy / "simulator" / "model" / "limits.py").write_text(
        '"""When a component is stepped through."""\nfrom dataclasses import dataclass\n\n\n'
        + text[start:end].rstrip() + "\n")
    inter.write_text(text[:start] + text[end:])
    _replace(inter, "from simulator.model.maxmin import max_min\n",
             "from simulator.model.limits import Limits\nfrom simulator.model.maxmin import max_min\n")
    engine = model_copy / "simulator" / "model" / "engine.py"
    engine.write_text(engine.read_text().replace("dark_time(", "switching_dark_time("))
    assert "class Limits" not in inter.read_text()
    assert fingerprint.run_in(model_copy)["fingerprint"] == identity.fingerprint()


def test_a_changed_constant_changes_the_fingerprint(model_copy):
    """The emulated ring step's fixed cost 9.7 ms -> 9.8 ms: the demo probe's predictions move, so does the
    fingerprint."""
    calibration = model_copy / "simulator" / "model" / "calibration.py"
    _replace(calibration, "STEP_S = 0.00970", "STEP_S = 0.00980")
    got = fingerprint.run_in(model_copy, names=("demo",))
    committed = json.loads(identity.FINGERPRINT.read_text())
    assert got["probes"]["demo"] != committed["probes"]["demo"]
    assert fingerprint.digest({**committed["probes"], **got["probes"]}) != committed["fingerprint"]
    assert fingerprint.digest(committed["probes"]) == committed["fingerprint"]


def test_each_record_names_its_model_computed_at_its_own_commit_and_three_of_each_kind_check_today_s():
    current = identity.fingerprint()
    demos = [r for r in records.load() if r.full]
    replays = sorted((ROOT / "results" / "replay").glob("*.json"))
    for path in [r.path for r in records.load()] + replays:
        data = json.loads(path.read_text())
        if data.get("model_fingerprint"):
            continue
        beside = json.loads(path.with_suffix(".fingerprint").read_text())
        commit, why = fingerprint.record_commit(path)
        assert beside["commit"].startswith(commit) and beside["command"] == fingerprint.COMMAND, path
        assert (beside["fingerprint"] is None) == bool(beside.get("why")), path
        if why:
            assert beside["fingerprint"] is None and beside["why"] == why, path
    assert len([r for r in demos if r.fingerprint == current]) >= 3
    assert len([p for p in replays if records.fingerprint_of(p, json.loads(p.read_text())) == current]) >= 3


def test_a_record_s_commit_is_read_from_its_name():
    assert fingerprint.record_commit(Path("20261126T225304Z-af9cc21.json")) == ("af9cc21", None)
    commit, why = fingerprint.record_commit(Path("20261125T091423Z-b841572-dirty.json"))
    assert commit == "b841572" and "uncommitted changes" in why
    assert fingerprint.record_commit(Path("20261125T091423Z-nogit.json"))[0] is None


def test_bad_input_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        fingerprint.main(["--at", "no-such-commit"])
    assert e.value.code == 2 and "'no-such-commit' is not a commit" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        fingerprint.main(["--records", str(tmp_path / "missing.json")])
    assert e.value.code == 2 and "no such record" in capsys.readouterr().err
    assert probes.main(["nonsense"]) == 2 and "unknown probe nonsense" in capsys.readouterr().err
