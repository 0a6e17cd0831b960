"""The `make demo` record `optirack simulate --case` runs against (simulator/cli/main.py): which record it calibrates
from
and compares with (--calibration's, else the newest committed whole record of the rack's fabric), and the table of
the simulated job of concern beside that record's emulated figures.
"""
from __future__ import annotations

import json
from pathlib import Path

from controller import bundled
from simulator.inputs import records
from simulator.model import calibration


def newest_record(fabric: str) -> Path | None:
    """The newest committed whole `make demo` record (both cases, repeated) made on `fabric`: what --case compares
    with and calibrates from by default."""
    directory = bundled.directory(bundled.RECORDS)
    installed = directory.is_relative_to(bundled.SHARE)  # pip's copy: no git to ask which are committed
    found = [r for r in records.load(directory, tracked_only=not installed)
             if r.full and (r.data.get("fabric") or "droptail") == fabric]
    return found[-1].path if found else None


def calibration_of(args, rack) -> tuple[Path | None, dict | None]:
    """The record --net emulation calibrates from, and --case compares with: --calibration's (an error where it
    cannot be read), else the newest of the rack's fabric."""
    if args.calibration is not None:
        path = bundled.find(args.calibration, bundled.RECORDS, ".json")
        if not path.is_file():
            raise ValueError(f"--calibration {args.calibration}: no such record (make demo writes them under "
                             f"{bundled.RECORDS}/)")
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"--calibration {args.calibration}: cannot read the record: {e}") from None
        if not isinstance(record, dict) or "points" not in record and "runs" not in record:
            raise ValueError(f"--calibration {args.calibration}: not a make demo record")
        return path, record
    path = newest_record(rack.spec.emulation.fabric)
    return path, (calibration.load_record(path) if path else None)


def checked_by(demo: dict, path: Path | None) -> str:
    """What checks the simulator against this record (tests/unit/test_sim_fidelity.py), in a few words."""
    from simulator import identity
    from simulator.model import fidelity

    if path is not None and path.stem == records.DROPTAIL_NAME:
        return (f"the record the held sharing was chosen on; the fidelity test checks each point within "
                f"{100 * fidelity.TOLERANCE:g} %, not out of sample")
    made_with = records.fingerprint_of(path, demo) if path is not None else demo.get("model_fingerprint")
    if made_with is not None and made_with == identity.fingerprint():
        return (f"made with the simulator's current model; the fidelity test checks each point within "
                f"{100 * fidelity.RECORD_TOLERANCE:g} %")
    return "made with an earlier model of the simulator: no test checks the current model against it"


def against_emulation(args, record: dict, demo: dict | None, demo_path: Path | None) -> str:
    """The job of concern per policy, and the demo's emulated figures beside the simulated ones when recorded."""
    from simulator.model import fidelity

    lines = ["| policy | job of concern: switches | mean iteration (both jobs started at once) | completion |",
             "| --- | --- | --- | --- |"]
    for name, p in record["policies"].items():
        job = p["jobs"][0]
        lines.append(f"| {name} | {job['switches']} | {job['mean_iteration_s']:.3f} s | {job['jct_s']:.1f} s |")
    if demo is None:
        lines += ["", "(no make demo record to compare with: run `make demo`.)"]
    else:
        rows, cal = fidelity.compare(demo, args.case, args.sharing)  # --sharing: a what-if against the emulation
        record["fidelity"] = [vars(r) | {"error": r.error} for r in rows]
        record["fidelity_record"] = demo_path.stem if demo_path else None
        lines += ["", f"Record `{demo_path.stem if demo_path else '?'}` ({demo.get('fabric') or 'droptail'} "
                  f"fabric): {checked_by(demo, demo_path)}.", fidelity.table(rows, cal), "",
                  f"The prediction set beside the emulation is the mean over {fidelity.OFFSETS} starts of the job "
                  "beside, spread over one iteration of the job of concern (the demo does not control the offset); "
                  "the first table's run, both jobs started at once, is one of them."]
    return "\n".join(lines)
