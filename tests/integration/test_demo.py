"""The README's first command in its quick form: the paper's case (a), fragmented and regrouped, on
the default rack, whose uplink is fitted to the paper (a steep one, so the effect is large by
construction: the full demo measures about 70 % saved); regrouping must make the job faster."""
import json
import subprocess
import sys

from tests.integration.helpers import ROOT

MAX_QUICK_SHARE_ERROR = 0.25  # of a flow's max-min share, over the quick run's few windows (below)


def test_quick_paper_experiment(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "evidence.demo.experiment", "--quick", "--results", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode in (0, 1), out
    (path,) = (tmp_path / "records").glob("*.json")  # a new record, named by its time and commit
    record = json.loads(path.read_text())
    out_dir = path.with_suffix("")  # its tables and figures
    c = record["checks"]
    assert c["regroup_within_noise"] and c["spread_ok"], out
    # The fabric: no packet dropped anywhere, ever. Issue #20 leaves one limit open: in about one run in ten a
    # container beside a regrouped job retransmits 1-2 % of its segments with nothing dropped (more than the demo's
    # 1 %, so the demo exits 1 and says so). Only that is let through here, printed; any drop fails the test.
    assert record["fabric"] == "lossless"
    not_retransmissions = [p for p in c["fabric_problems"] if "TCP segments retransmitted" not in p]
    assert not not_retransmissions, not_retransmissions
    # The uplink shares: the quick run's fragmented job iterates 4 times, so a flow is judged over 5-10 windows, the
    # first ones TCP's start (a fresh clone of 91bffb2, 2026-12-07 22:17 UTC: two flows +-13 % off over 5 windows, per
    # window +22, +18, 0, +3, +13 %). The demo still fails on more than 10 % (emulation/shares.py, as make demo does);
    # here a flow off by up to MAX_QUICK_SHARE_ERROR is printed, not failed, and one off by more fails the test.
    judged = [(f"{r['tag']}: {k}", f["error"]) for r in record["runs"]
              for k, f in ((r.get("fabric_counters") or {}).get("uplink_shares") or {"flows": {}})["flows"].items()
              if f.get("judged")]
    assert all(abs(e) <= MAX_QUICK_SHARE_ERROR for _, e in judged), judged
    assert proc.returncode == (1 if c["fabric_problems"] or c["uplink_share_problems"] else 0), out
    for p in c["fabric_problems"]:
        print(f"known limit of the lossless fabric (issue #20): {p}")
    for p in c["uplink_share_problems"]:
        print(f"a share off in the quick run's few windows (at most {100 * MAX_QUICK_SHARE_ERROR:g} % here): {p}")
    for name in ("paper-experiment.md", "fig3-case-a.png"):
        assert (out_dir / name).stat().st_size > 1000, name
    runs = {r["summary"]["policy"]: r["summary"] for r in record["runs"]}
    # the mechanism: the fragmented job spans both aggregator switches, the regrouped one sits under one
    assert len(runs["regroup"]["switches"]) == 1 and len(runs["fixed"]["switches"]) == 2
    assert record["rack_sha256"] and record["versions"]["torch"] and record["versions"]["git_dirty"] is not None
    from evidence import modelhash
    from simulator import identity

    assert record["model_hash"] == modelhash.model_hash() and path.stem.startswith(record["started_utc"])
    assert record["model_fingerprint"] == identity.fingerprint()  # this checkout's: its predictions did not move
    assert record["calibration"]["runs"] and "fraction" in record["calibration"]["runs"][0]
    (point,) = record["points"]
    print(f"case (a) on the fitted rack: regrouping saved {100 * point['saving']['median']:.1f} % "
          f"(compute fraction {point['fixed']['mean_gpu_util']:.2f} -> {point['regroup']['mean_gpu_util']:.2f})")
    # about 74 % expected (the records of 2026-11-25); a busy host moves it by a few points, not by 44
    assert runs["regroup"]["completion_s"] < 0.7 * runs["fixed"]["completion_s"]
    table = (out_dir / "paper-experiment.md").read_text()
    assert "| (a) | 4 GPUs" in table and "407 s → 109 s" in table and "calibration:" in table
