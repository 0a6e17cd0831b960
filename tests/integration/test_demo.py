"""The README's first command in its quick form: the paper's case (a), fragmented and regrouped,
plus the most oversubscribed sweep point; regrouping must make the job faster."""
import json
import subprocess
import sys

from tests.integration.helpers import ROOT


def test_quick_paper_experiment(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.paper_experiment", "--quick", "--results", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "paper-experiment.json").read_text())
    for name in ("paper-experiment.md", "fig3-case-a.png", "sweep-uplink.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    runs = {r["summary"]["policy"]: r["summary"] for r in record["runs"]}
    assert len(runs["regroup"]["switches"]) == 1 and len(runs["fixed"]["switches"]) == 2
    assert record["rack_sha256"] and record["versions"]["torch"]
    point = next(p for p in record["sweep"] if p["nic_to_uplink"] == 8)
    print(f"case (a) at NIC:uplink 1:8: regrouping saved {100 * point['reduction']:.1f} % "
          f"(GPU utilization {point['fixed']['mean_gpu_util']:.2f} -> {point['regroup']['mean_gpu_util']:.2f})")
    assert point["regroup"]["completion_s"] < 0.8 * point["fixed"]["completion_s"]
    assert point["regroup"]["mean_gpu_util"] > point["fixed"]["mean_gpu_util"]
    table = (tmp_path / "paper-experiment.md").read_text()
    assert "| (a) | 4 GPUs" in table and "407 s → 109 s" in table
