"""The benchmarks' statistics: min, median and max over repetitions, and the --json record."""
import argparse
import json

import pytest

from scripts.stats import add_json_option, show, spread, write_json


def test_spread_and_show():
    s = spread([0.003, 0.001, 0.002, 0.010], scale=1000)
    assert (s["n"], s["min"], s["median"], s["max"]) == (4, 1.0, 2.5, 10.0)
    assert s["values"] == [3.0, 1.0, 2.0, 10.0]
    assert show(s, "ms") == "2.5 (1.0–10.0) ms"
    with pytest.raises(ValueError):
        spread([])


def test_json_record(tmp_path):
    p = argparse.ArgumentParser()
    add_json_option(p)
    args = p.parse_args(["--json", str(tmp_path / "out.json")])
    write_json(args.json, [{"x": spread([1, 2, 3])}])
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["results"][0]["x"]["median"] == 2 and record["command"] and record["time"]
    write_json(None, [])  # no --json: nothing written, no error
