"""The event log and the throughput history."""
from controller.core.events import EventLog
from controller.core.stats import PortHistory


def test_event_durations_and_bound():
    log = EventLog(size=3)
    ev = log.start("circuits", "test", now=10.0)
    ev.dark_start, ev.dark_end, ev.flows_confirmed_at, ev.switching_time_s = 10.01, 10.04, 10.05, 0.025
    d = ev.to_json()
    assert abs(d["dark_window_s"] - 0.03) < 1e-9 and abs(d["total_s"] - 0.05) < 1e-9
    assert abs(d["overhead_s"] - 0.025) < 1e-9
    for _ in range(5):
        log.start("circuits", "more", now=11.0)
    assert [e.id for e in log.recent()] == [4, 5, 6] and log.get(1) is None and len(log.recent(2)) == 2


def test_throughput_from_counters():
    h = PortHistory(size=2)
    assert h.record(1, 5, 0.0, 0, 0) is None
    s = h.record(1, 5, 2.0, 1000, 500)
    assert (s.rx_bps, s.tx_bps) == (4000, 2000)
    assert h.record(1, 5, 3.0, 10, 10) is None  # counters went back: the port was re-created
    h.record(1, 5, 4.0, 1010, 10)
    h.record(1, 5, 5.0, 2010, 10)
    assert len(h.history(1, 5)) == 2 and h.latest(1, 5).rx_bps == 8000
    h.forget(1)
    assert h.record(1, 5, 6.0, 3000, 10) is None
