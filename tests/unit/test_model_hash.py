"""evidence/modelhash.py: the older name of a model, the hash over its files, that records keep."""
from __future__ import annotations

from pathlib import Path

from evidence import modelhash

ROOT = Path(__file__).resolve().parents[2]


def test_comments_docstrings_and_blank_lines_do_not_change_the_hash_but_code_does():
    src = (ROOT / "simulator" / "model" / "calibration.py").read_text()
    files = {f: (ROOT / f).read_text() for f in modelhash.MODEL_FILES}

    def hashed(text):
        return modelhash.model_hash(lambda f: text if f == "simulator/model/calibration.py" else files[f])

    base = hashed(src)
    assert base == modelhash.model_hash()
    reworded = src.replace('"""The network parameters', '"""Reworded: the network parameters', 1)
    reworded = reworded.replace("\nclass Calibration:", "\n\n# a new comment\n\nclass Calibration:  # and another", 1)
    assert reworded != src and hashed(reworded) == base
    changed = src.replace("STEP_S = 0.00970", "STEP_S = 0.001", 1)
    assert changed != src and hashed(changed) != base
    # a file of the set missing is another model too
    assert modelhash.model_hash(lambda f: None if f == "simulator/model/maxmin.py" else files[f]) != base


def test_a_string_that_is_not_a_docstring_counts():
    a = 'def f():\n    """doc"""\n    return "x"  # why\n'
    assert modelhash.normalise(a) == "def f():\n    return \"x\""
    assert modelhash.normalise(a.replace('"x"', '"y"')) != modelhash.normalise(a)


def test_the_hash_at_a_commit_reads_that_commit_and_is_unknowable_for_an_unknown_one():
    assert modelhash.model_hash_at("0" * 40) is None
    head = modelhash.model_hash_at("HEAD")
    assert head is not None and len(head) == 64
