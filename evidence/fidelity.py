"""The fidelity test's check of one `make demo` record: every point within RECORD_TOLERANCE of the emulated median,
and every case x policy there (tests/unit/test_sim_fidelity.py runs it on each committed record of the current
model, evidence/records.py)."""
from __future__ import annotations

from simulator.model.fidelity import RECORD_TOLERANCE, Point, compare

NEEDED = {("a", "fixed"), ("a", "regroup"), ("b", "fixed"), ("b", "regroup")}


def check_record(record: dict, tolerance: float = RECORD_TOLERANCE) -> tuple[list[Point], list[str]]:
    """Every point of a record (both cases at the demo's rack, case (a) at each sweep point, each policy) simulated
    with the record's calibration; returns the rows and what failed: a point further than `tolerance` from the
    emulated median, or a case x policy the record lacks."""
    rows, _ = compare(record)
    failures = [f"{p.label}, {'fragmented' if p.policy == 'fixed' else 'regrouped'}: simulated {p.simulated_s:.3f} s "
                f"against {p.emulated_s:.3f} s emulated ({100 * p.error:+.1f} %, more than {100 * tolerance:g} %)"
                for p in rows if not abs(p.error) <= tolerance]
    missing = NEEDED - {(p.case, p.policy) for p in rows if "demo rack" in p.label}
    failures += [f"no point for case ({c}), {pol}" for c, pol in sorted(missing)]
    return rows, failures
