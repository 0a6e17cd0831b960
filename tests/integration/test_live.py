"""Seeing the rack live: a real Prometheus scraping /metrics, the Grafana dashboard's queries through it,
and the live page driven in headless Chromium, on the emulated paper rack with real jobs."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from controller.core.rack import load_rack
from emulation.harness import Testbed
from emulation.observe import CHROMIUM, Browser, Prometheus
from tests.integration.helpers import PAPER, ROOT, wait_for

RACK = load_rack(PAPER)
FRAGMENTED = [["ocs1:1", "ocs1:11"], ["ocs1:5", "ocs1:12"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:21"],
              ["ocs1:6", "ocs1:22"], ["ocs1:4", "ocs1:23"]]  # the rack file's server-centric cabling
RED = ["gpu1", "gpu2", "gpu3", "gpu4"]  # under both switches in FRAGMENTED
DASHBOARD = ROOT / "dashboards" / "optirack.json"
ACTIVE = ("queued", "pending", "configuring", "running")


@pytest.fixture(scope="module", autouse=True)
def _observers():
    """Prometheus, promtool, Chromium and Playwright: make setup installs them; CI must have them."""
    missing = [t for t in ("prometheus", "promtool") if shutil.which(t) is None]
    missing += [] if Path(CHROMIUM).exists() else [CHROMIUM]
    missing += [] if importlib.util.find_spec("playwright") else ["playwright (pip)"]
    if missing:
        reason = f"not installed: {', '.join(missing)} (run make setup)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """The paper rack and a controller listening on every address (--bind), as an operator would run it."""
    with Testbed(RACK, PAPER, tmp_path_factory.mktemp("live"), extra=["--bind", "0.0.0.0"]) as tb:
        yield tb


@pytest.fixture
def fragmented(bed):
    """No job running and the rack file's cabling; jobs started by the test are stopped afterwards, pass or fail."""
    idle = lambda: not any(j["state"] in ACTIVE for j in bed.client.get("/jobs")["jobs"])  # noqa: E731
    wait_for(idle, 120, "earlier jobs to end")
    bed.client.put("/ocs/circuits", {"circuits": FRAGMENTED})
    yield bed
    for job in bed.client.get("/jobs")["jobs"]:
        if job["state"] == "running":
            bed.client.delete(f"/jobs/{job['id']}")
    wait_for(idle, 120, "the test's jobs to end")


def submit(client, gpus, policy, iterations):
    body = {"gpus": gpus, "policy": policy, "workload": {"iterations": iterations, "compute_seconds": 0.05}}
    return client.post("/jobs", body)["job"]["id"]


def job(client, job_id) -> dict:
    return client.get(f"/jobs/{job_id}")["job"]


def test_bind_serves_every_address_and_mutations_still_need_the_token(bed):
    port = bed.controller.rest_port
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout.split()
    assert f"0.0.0.0:{port}" in listening, listening
    assert requests.get(bed.controller.url + "/metrics", timeout=10).status_code == 200
    assert requests.get(bed.controller.url + "/", timeout=10).status_code == 200
    assert requests.post(bed.controller.url + "/api/v1/regroup", timeout=10).status_code == 401


# --- Prometheus ---------------------------------------------------------------------------------------
def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target in the dashboard, with Grafana's variables filled in."""
    doc = json.loads(DASHBOARD.read_text())
    panels = [p for top in doc["panels"] for p in [top, *top.get("panels", [])]]
    fill = {"$__rate_interval": "15s", "$job_id": ".+", "$gpu": ".+"}
    out = []
    for p in panels:
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in fill.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"panel {p['title']!r}: unknown variable in {expr}"
            out.append((p["title"], expr))
    return out


def mean_tx_bps(history: list[dict], t0: float, t1: float) -> float:
    """A GPU's mean transmit rate over (t0, t1] from GET /stats/ports?history samples (each a rate since the last)."""
    bits = sum(
        s["tx_bps"] * (s["t"] - prev["t"]) for prev, s in zip(history, history[1:], strict=False) if t0 < s["t"] <= t1
    )
    return bits / (t1 - t0)


def test_prometheus_sees_the_jobs_throughput_and_every_dashboard_panel(fragmented, tmp_path):
    bed = fragmented
    client, url = bed.client, bed.controller.url
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=requests.get(url + "/metrics", timeout=10).content, capture_output=True
    )
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr
    with Prometheus(tmp_path, [url.removeprefix("http://")], scrape_interval="1s") as prom:
        prom.wait_scraped()
        t0 = time.time()
        job_id = submit(client, RED, "regroup", 30)  # regrouping the fragmented start is a reconfiguration
        wait_for(lambda: job(client, job_id)["iterations_done"] >= 12, 120, "12 iterations")
        time.sleep(3)  # a few scrapes with the job's series in them
        empty = [
            (title, q)
            for title, q in panel_queries()
            if not any(math.isfinite(float(s["value"][1])) for s in prom.query(q))
        ]
        assert not empty, f"dashboard panels with no series (or only NaN): {empty}"
        per_job = prom.query(
            f"sum by (job_id) (rate(optirack_gpu_port_transmit_bytes_total[15s]) * 8 * on (gpu) "
            f'group_left (job_id) optirack_gpu_job{{job_id="{job_id}"}})'
        )
        assert [s["metric"]["job_id"] for s in per_job] == [job_id] and float(per_job[0]["value"][1]) > 0
        wait_for(lambda: job(client, job_id)["state"] not in ACTIVE, 180, f"{job_id} to end")
        assert job(client, job_id)["state"] == "done"
        time.sleep(4)  # the last counters polled by the monitor and scraped by Prometheus
        t1 = time.time()
        # The same window both ways: Prometheus' rate over (t0, t1] against the monitor's samples over it.
        window = f"{int(t1 - t0)}s"
        history = client.get("/stats/ports", history=600)["gpus"]
        for gpu in RED:
            series = prom.query(f'rate(optirack_gpu_port_transmit_bytes_total{{gpu="{gpu}"}}[{window}]) * 8', at=t1)
            assert len(series) == 1, series
            promql_bps = float(series[0]["value"][1])
            api_bps = mean_tx_bps(history[gpu]["history"], t1 - int(t1 - t0), t1)
            print(
                f"{gpu}: Prometheus {promql_bps / 1e6:.2f} Mbit/s, GET /stats/ports {api_bps / 1e6:.2f} Mbit/s "
                f"over {window}"
            )
            assert api_bps > 1e6, f"{gpu} carried no traffic: {api_bps} bit/s"
            assert abs(promql_bps - api_bps) <= 0.2 * api_bps


# --- the live page in a browser --------------------------------------------------------------------------
def drawn_circuits(page) -> set[frozenset[str]]:
    return {
        frozenset(c.split())
        for c in page.eval_on_selector_all("#rack [data-circuit]", "els => els.map(e => e.dataset.circuit)")
    }


def api_circuits(client) -> set[frozenset[str]]:
    return {frozenset(c) for c in client.get("/ocs/circuits")["circuits"]}


def chart_points(page, job_id: str) -> int:
    sel = f'#chart-iterations polyline[data-series="{job_id}"]'
    return int(page.get_attribute(sel, "data-points") or 0) if page.query_selector(sel) else 0


def test_live_page_in_a_browser(fragmented, tmp_path):
    bed = fragmented
    client = bed.client
    token = (bed.controller.state_dir / "token").read_text().strip()
    with Browser() as browser:
        page = browser.page
        page.goto(bed.controller.url + "/")
        page.wait_for_function(
            f"document.querySelectorAll('#rack [data-gpu]').length === {len(RACK.gpus)}", timeout=20_000
        )
        gpus = page.eval_on_selector_all("#rack [data-gpu]", "els => els.map(e => e.dataset.gpu)")
        assert sorted(gpus) == sorted(RACK.gpus)
        assert drawn_circuits(page) == api_circuits(client) == {frozenset(c) for c in FRAGMENTED}

        job_id = submit(client, RED, "fixed", 400)  # the paper's fragmented start: under both switches
        page.wait_for_selector(f'#jobs tr[data-job="{job_id}"][data-state="running"]', timeout=60_000)
        wait_for(lambda: chart_points(page, job_id) >= 3, 60, "the iteration chart's first points")
        first = chart_points(page, job_id)
        wait_for(lambda: chart_points(page, job_id) > first, 30, "the iteration chart to gain points")
        coloured = page.eval_on_selector_all(
            f'#rack [data-gpu][data-job="{job_id}"]', "els => els.map(e => e.dataset.gpu)"
        )
        assert sorted(coloured) == RED
        assert len(job(client, job_id)["switches"]) == 2

        before = drawn_circuits(page)
        page.select_option("#regroup-target", job_id)
        page.click("#regroup")
        page.fill("#token", token)  # the page asks for the token
        page.click("#token-ok")
        page.wait_for_function(
            f"document.getElementById('regroup-result').textContent.startsWith('{job_id}: under')", timeout=60_000
        )
        regrouped = api_circuits(client)
        assert regrouped != before and len(job(client, job_id)["switches"]) == 1
        wait_for(lambda: drawn_circuits(page) == regrouped, 10, "the page to draw the new circuits")
        page.wait_for_selector("#events tr[data-event] >> text=regroup", timeout=10_000)

        regroup_at = chart_points(page, job_id)
        wait_for(lambda: chart_points(page, job_id) >= regroup_at + 8, 60, "iterations after the regroup")
        shot = Path(os.environ.get("OPTIRACK_SCREENSHOT") or tmp_path / "dashboard.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000

        client.post(f"/jobs/{job_id}/stop")  # DELETE would forget the job: the page must show it stopped
        page.wait_for_selector(f'#jobs tr[data-job="{job_id}"][data-state="stopped"]', timeout=30_000)
        assert drawn_circuits(page) == api_circuits(client)
