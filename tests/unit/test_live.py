"""/metrics, the live page and its feed, in-process with fake switches, a fake container driver and webob."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families
from ryu.controller import ofp_event
from ryu.ofproto import ofproto_v1_3_parser as parser
from webob import Request

from controller.apps.context import Optirack
from controller.apps.fabric import FabricApp
from controller.apps.inventory import Inventory
from controller.apps.jobs_api import JobsApi
from controller.apps.live import LiveApp
from controller.apps.live_feed import Feed
from controller.apps.metrics import MetricsApp
from controller.apps.ocs import OcsApp
from controller.apps.placement import PlacementApp
from controller.apps.rest import Api, NotFound
from controller.core.jobs import JobRequest
from controller.core.rack import load_rack
from tests.unit.fakes import FakeDriver, FakeSwitch, wait_until
from tests.unit.test_rack import PAPER

RACK = load_rack(PAPER)


@pytest.fixture
def rig(tmp_path):
    """Every app on one context and one WSGI application, the switches connected, no job yet."""
    from ryu.app.wsgi import WSGIApplication  # after controller.apps' Ryu compatibility step

    ctx = Optirack(rack=RACK, state_dir=tmp_path, containers=FakeDriver(iterations=3))
    wsgi = WSGIApplication()
    ocs_app = OcsApp(optirack=ctx)
    apps = [Inventory(optirack=ctx), ocs_app, FabricApp(optirack=ctx)]
    placement = PlacementApp(optirack=ctx).service
    metrics_app = MetricsApp(optirack=ctx, wsgi=wsgi)
    LiveApp(optirack=ctx, wsgi=wsgi)
    for cls in (Api, JobsApi, NotFound):
        wsgi.register(cls, {"optirack": ctx})
    dps = {dpid: FakeSwitch(dpid, apps) for dpid in (0x100, 0x201, 0x202)}
    for dp in dps.values():
        dp.connect()
    wait_until(lambda: "ocs1" in ocs_app.synchronised and not ctx.lock.locked(), what="the OCS synchronised")
    wait_until(lambda: set(apps[2].installed) == {"as1", "as2"}, what="both switches' tables")
    return ctx, wsgi, placement, metrics_app, dps


def get(wsgi, path: str, **kw):
    return Request.blank(path, **kw).get_response(wsgi)


def scrape(wsgi) -> dict[tuple[str, tuple], float]:
    resp = get(wsgi, "/metrics")
    assert resp.status_int == 200 and resp.content_type == "text/plain"
    samples = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def port_stats(metrics_app, dp, stats: dict[int, tuple[int, int, int, int]]) -> None:
    """Deliver a port-statistics reply: port -> (rx_bytes, tx_bytes, rx_packets, tx_packets)."""
    body = [parser.OFPPortStats(port_no=p, rx_packets=rp, tx_packets=tp, rx_bytes=rb, tx_bytes=tb, rx_dropped=0,
                                tx_dropped=0, rx_errors=0, tx_errors=0, rx_frame_err=0, rx_over_err=0, rx_crc_err=0,
                                collisions=0, duration_sec=0, duration_nsec=0)
            for p, (rb, tb, rp, tp) in stats.items()]
    msg = parser.OFPPortStatsReply(dp, body=body, flags=0)
    metrics_app._port_stats(ofp_event.ofp_msg_to_ev(msg))


def run_job(placement, **kw):
    kw.setdefault("workload", {"iterations": 3})
    job = placement.submit(JobRequest.model_validate(kw))
    wait_until(lambda: not placement.get(job.id).active, what="the job to end")
    assert job.state == "done", job.reason
    return job


@pytest.mark.skipif(shutil.which("promtool") is None and not os.environ.get("CI"),
                    reason="promtool is not installed (Debian package prometheus; make setup installs it)")
def test_promtool_accepts_the_metrics(rig):
    ctx, wsgi, placement, metrics_app, dps = rig
    port_stats(metrics_app, dps[0x100], {1: (1000, 2000, 10, 20)})
    port_stats(metrics_app, dps[0x201], {10: (300, 400, 3, 4)})
    run_job(placement, gpus=["gpu1", "gpu2"], policy="fixed")
    get(wsgi, "/api/v1/topology")
    text = get(wsgi, "/metrics").body
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr


def test_port_counters_are_the_nics_view_and_devices_are_reported(rig):
    ctx, wsgi, _, metrics_app, dps = rig
    # gpu1's NIC is on OCS port 1: the OCS received 1,000 bytes from it and sent it 2,000.
    port_stats(metrics_app, dps[0x100], {1: (1000, 2000, 10, 20), 11: (5, 6, 7, 8)})
    # as1's uplink is port 10 (rack file): it received 300 bytes and sent 400.
    port_stats(metrics_app, dps[0x201], {10: (300, 400, 3, 4)})
    m = scrape(wsgi)
    gpu1 = (("gpu", "gpu1"), ("ocs_port", "ocs1:1"), ("server", "srv1"))
    assert m[("optirack_gpu_port_transmit_bytes_total", gpu1)] == 1000
    assert m[("optirack_gpu_port_receive_bytes_total", gpu1)] == 2000
    assert m[("optirack_gpu_port_transmit_packets_total", gpu1)] == 10
    assert m[("optirack_gpu_port_receive_packets_total", gpu1)] == 20
    assert not any(k[0].startswith("optirack_gpu_port") and ("gpu", "gpu2") in k[1] for k in m)  # never polled
    uplink = (("peer", "as2:10"), ("port", "10"), ("switch", "as1"))
    assert m[("optirack_uplink_transmit_bytes_total", uplink)] == 400
    assert m[("optirack_uplink_receive_bytes_total", uplink)] == 300
    assert m[("optirack_ocs_circuits", (("ocs", "ocs1"),))] == 6
    for device, kind in (("ocs1", "ocs"), ("as1", "switch"), ("as2", "switch")):
        assert m[("optirack_device_connected", (("device", device), ("kind", kind)))] == 1
        assert m[("optirack_device_synchronised", (("device", device), ("kind", kind)))] == 1
    dps[0x202].disconnect()
    assert scrape(wsgi)[("optirack_device_connected", (("device", "as2"), ("kind", "switch")))] == 0


def test_iterations_and_reconfigurations_are_observed_once(rig):
    ctx, wsgi, placement, _, _ = rig
    job = run_job(placement, gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup")
    assert len(job.events) == 1  # regrouping the fragmented start took one reconfiguration
    for _ in range(2):  # a second scrape observes nothing twice
        m = scrape(wsgi)
        jl = (("job_id", job.id),)
        assert m[("optirack_job_iteration_seconds_count", jl)] == 3
        assert m[("optirack_job_iteration_seconds_sum", jl)] == pytest.approx(3.0)
        assert m[("optirack_job_iteration_seconds_bucket", jl + (("le", "0.75"),))] == 0
        assert m[("optirack_job_iteration_seconds_bucket", jl + (("le", "1.0"),))] == 3
        assert m[("optirack_job_gpu_utilization_ratio", jl)] == pytest.approx(0.6)
        kind = (("kind", "job"),)
        assert m[("optirack_reconfiguration_dark_window_seconds_count", kind)] == 1
        ev = ctx.events.get(job.events[0])
        assert m[("optirack_reconfiguration_dark_window_seconds_sum", kind)] == pytest.approx(ev.dark_window_s)
        assert m[("optirack_reconfiguration_control_overhead_seconds_sum", kind)] == pytest.approx(
            ev.total_s - ev.switching_time_s)
        assert m[("optirack_reconfigurations_total", (("kind", "job"), ("status", "ok")))] == 1
        assert m[("optirack_jobs", (("state", "done"),))] == 1
        assert m[("optirack_jobs", (("state", "running"),))] == 0


def test_rest_requests_are_counted_by_route_template(rig):
    _, wsgi, _, _, _ = rig
    assert get(wsgi, "/api/v1/jobs/nope").status_int == 404
    assert get(wsgi, "/api/v1/jobs/other").status_int == 404
    assert get(wsgi, "/api/v1/regroup", method="POST").status_int == 401
    assert get(wsgi, "/api/v1/nowhere").status_int == 404
    m = scrape(wsgi)
    counted = {dict(k[1])["route"] + " " + dict(k[1])["method"] + " " + dict(k[1])["code"]: v
               for k, v in m.items() if k[0] == "optirack_rest_requests_total"}
    assert counted["/api/v1/jobs/{job_id} GET 404"] == 2  # one series per route, not per job id
    assert counted["/api/v1/regroup POST 401"] == 1
    assert counted["/{path} GET 404"] == 1  # the catch-all takes unknown paths anywhere
    assert any(k[0] == "optirack_rest_requests_total" and dict(k[1])["route"] == "/metrics" for k in scrape(wsgi))


def test_the_page_and_its_assets_are_served_from_the_controller(rig):
    _, wsgi, _, _, _ = rig
    page = get(wsgi, "/")
    assert page.status_int == 200 and page.content_type == "text/html"
    assets = re.findall(r'(?:src|href)="(/[^"]*)"', page.text)
    assert "/static/live.js" in assets and "/static/live.css" in assets
    for path in assets:
        assert get(wsgi, path).status_int == 200, path
    for name in ("index.html", "live.js", "live.css"):
        text = get(wsgi, "/" if name == "index.html" else f"/static/{name}").text
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text.replace("http://www.w3.org/2000/svg", "")), \
            f"{name} refers to another host"
    assert get(wsgi, "/static/live.js").content_type == "text/javascript"
    assert get(wsgi, "/static/missing.js").status_int == 404
    assert get(wsgi, "/static/..%2Fmetrics.py").status_int == 404


def test_feed_sends_the_rack_once_then_only_changes(rig):
    ctx, wsgi, placement, _, _ = rig
    feed = Feed(ctx)
    first = feed.next()
    assert set(first["rack"]["gpus"]) == set(RACK.gpus) and first["circuits"] == ctx.circuits.to_json()
    second = feed.next()
    assert "rack" not in second and "circuits" not in second and second["events"] == [] and second["ports"] == {}
    ref = RACK.gpu_port("gpu2")
    ctx.ports.record(0x100, ref.port, 100.0, 0, 0)
    ctx.ports.record(0x100, ref.port, 101.0, 125_000, 250_000)  # the OCS received 1 Mbit/s from the NIC
    assert feed.next()["ports"] == {"gpu2": [[101.0, 1_000_000, 2_000_000]]}
    assert feed.next()["ports"] == {}
    job = run_job(placement, gpus=["gpu1", "gpu2", "gpu3", "gpu4"], policy="regroup")
    msg = feed.next()
    assert msg["circuits"] == ctx.circuits.to_json() and msg["rack"]["gpus"]["gpu1"]["switch"]["name"] in job.switches
    assert [e["id"] for e in msg["events"]] == job.events
    assert msg["jobs"][job.id]["state"] == "done" and msg["job_order"] == [job.id]
    assert [p[1] for p in msg["iterations"][job.id]] == [1.0, 1.0, 1.0]
    again = feed.next()
    assert again["jobs"] == {} and again["iterations"] == {} and again["events"] == []


def test_state_and_stream_outside_the_api(rig):
    ctx, wsgi, _, _, _ = rig
    state = json.loads(get(wsgi, "/live/state").body)
    assert state["circuits"] == ctx.circuits.to_json()
    resp = get(wsgi, "/live/stream")
    assert resp.content_type == "text/event-stream"
    chunks = iter(resp.app_iter)
    assert next(chunks).startswith(b"retry:")
    first = next(chunks)
    assert first.startswith(b"data: ") and first.endswith(b"\n\n")
    assert json.loads(first[6:])["rack"]["rack"] == RACK.name
    second = json.loads(next(chunks)[6:])  # one interval later: nothing changed
    assert "rack" not in second
    resp.app_iter.close()
