"""The trace check's bars, read from the committed, dated files evidence/bars/trace-v<N>.toml: what a replay of a
trace must meet, set before the replays it judges.

A bars file names the model it judges (its fingerprint) and the instant it was set; it judges the replay records of
that model started after that instant. It is never edited: a changed bar is a new version, which judges only the
replays made after it (tests/unit/test_tracebars.py checks both against git). Each version holds

- `literal`: each replay record, each policy, alone: median and p90 of |error| of the jobs' completion times, the
  makespan's |error|, the start order the same;
- optionally `noise_aware`: each policy over at least `min_replays` replays of one trace: the same figures against
  the replays' mean (each job's mean completion time, the mean makespan), and the start order differing from each
  replay by no more pairs than two replays differ from each other.

Both are shown side by side; a noise-aware pass does not turn a literal miss into a pass.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

BARS = Path(__file__).resolve().parent / "bars"
_FIGURES = ("jct_error_median", "jct_error_p90", "makespan_error")


class BarsError(ValueError):
    """A bars file that cannot be read or lacks a field; the message names the file and the field."""


@dataclass(frozen=True)
class Bars:
    version: int
    set_utc: datetime
    model_fingerprint: str
    literal: dict
    noise_aware: dict | None
    path: Path
    first_committed_in: str | None = None

    @property
    def name(self) -> str:
        return f"v{self.version} (set {self.set_utc:%Y-%m-%d %H:%M} UTC)"


def utc(stamp: str) -> datetime:
    """An instant as the bars files write it (2026-11-28T19:00:00Z) or as a record's name begins (20261128T190000Z)."""
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y%m%dT%H%M%SZ"):
        try:
            return datetime.strptime(stamp, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValueError(f"{stamp!r} is not a UTC instant (2026-11-28T19:00:00Z)")


def _fraction(path: Path, section: str, d: dict, key: str) -> float:
    v = d.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v < 1:
        raise BarsError(f"{path}: [{section}] {key} must be a fraction between 0 and 1, not {v!r}")
    return float(v)


def read(path: Path) -> Bars:
    """One bars file, checked field by field."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise BarsError(f"{path}: cannot read the bars: {e}") from None
    try:
        version, fingerprint = data["version"], data["model_fingerprint"]
        set_utc = utc(data["set_utc"])
    except KeyError as e:
        raise BarsError(f"{path}: no {e.args[0]}") from None
    except (TypeError, ValueError) as e:
        raise BarsError(f"{path}: set_utc: {e}") from None
    if not isinstance(version, int) or path.stem != f"trace-v{version}":
        raise BarsError(f"{path}: version {version!r} is not the file's (trace-v<version>.toml)")
    if not isinstance(fingerprint, str) or len(fingerprint) != 64:
        raise BarsError(f"{path}: model_fingerprint must be the model's 64 hex digits, not {fingerprint!r}")
    sections = {}
    for section in ("literal", "noise_aware"):
        d = data.get(section)
        if d is None and section == "noise_aware":
            sections[section] = None
            continue
        if not isinstance(d, dict):
            raise BarsError(f"{path}: no [{section}] table")
        out = {k: _fraction(path, section, d, k) for k in _FIGURES}
        out["start_order"] = d.get("start_order")
        if section == "noise_aware":
            n = d.get("min_replays")
            if not isinstance(n, int) or n < 2:
                raise BarsError(f"{path}: [noise_aware] min_replays must be an integer of 2 or more, not {n!r}")
            out["min_replays"] = n
        sections[section] = out
    return Bars(version, set_utc, fingerprint, sections["literal"], sections["noise_aware"], path,
                data.get("first_committed_in"))


def load(directory: Path = BARS) -> list[Bars]:
    """Every version, oldest first; versions must run 1, 2, ... and be set one after the other."""
    versions = sorted((read(p) for p in directory.glob("trace-v*.toml")), key=lambda b: b.version)
    if not versions:
        raise BarsError(f"{directory}/trace-v*.toml: no bars file")
    for i, b in enumerate(versions, 1):
        if b.version != i:
            raise BarsError(f"{b.path}: version {b.version} where version {i} was expected")
        if i > 1 and b.set_utc <= versions[i - 2].set_utc:
            raise BarsError(f"{b.path}: set {b.set_utc:%Y-%m-%dT%H:%M:%SZ}, not after version {i - 1}")
    return versions


def newest(directory: Path = BARS) -> Bars:
    return load(directory)[-1]


def in_force(versions: list[Bars], fingerprint: str | None, started: datetime) -> Bars | None:
    """The bars that judge a replay of the model `fingerprint` started at `started`: the newest version of that
    model set before it (None: no bars were set for it in time, and nothing judges it)."""
    fitting = [b for b in versions if b.model_fingerprint == fingerprint and b.set_utc <= started]
    return fitting[-1] if fitting else None


def literal(c: dict, bars: Bars) -> list[str]:
    """What one policy run of one replay (tracecheck.compare's dict) fails of the literal bars (empty: it passes)."""
    b, out = bars.literal, []
    if c["jct_error_median"] > b["jct_error_median"]:
        out.append(f"median |error| of completion time {100 * c['jct_error_median']:.1f} % > "
                   f"{100 * b['jct_error_median']:g} %")
    if c["jct_error_p90"] > b["jct_error_p90"]:
        out.append(f"p90 |error| of completion time {100 * c['jct_error_p90']:.1f} % > {100 * b['jct_error_p90']:g} %")
    if abs(c["makespan_error"]) > b["makespan_error"]:
        out.append(f"makespan {100 * c['makespan_error']:+.1f} % (bound ±{100 * b['makespan_error']:g} %)")
    if not c["start_order_same"]:
        out.append(f"start order differs: {len(c['start_order_discordant'])} pairs of jobs the other way round")
    return out


def noise_aware(m: dict, bars: Bars) -> list[str]:
    """What tracejudge.against_mean's figures fail of the bars' noise-aware part (empty: it passes)."""
    b = bars.noise_aware
    if b is None:
        return [f"bars {bars.name} set no noise-aware bar"]
    out = []
    if m["replays"] < b["min_replays"]:
        out.append(f"{m['replays']} replay(s); the noise-aware bar needs {b['min_replays']}")
    if m["jct_error_median"] > b["jct_error_median"]:
        out.append(f"median |error| against the jobs' mean {100 * m['jct_error_median']:.1f} % > "
                   f"{100 * b['jct_error_median']:g} %")
    if m["jct_error_p90"] > b["jct_error_p90"]:
        out.append(f"p90 |error| against the jobs' mean {100 * m['jct_error_p90']:.1f} % > "
                   f"{100 * b['jct_error_p90']:g} %")
    if abs(m["makespan_error"]) > b["makespan_error"]:
        out.append(f"makespan {100 * m['makespan_error']:+.1f} % from the replays' mean "
                   f"(bound ±{100 * b['makespan_error']:g} %)")
    if m["start_pairs_simulated"] > m["start_pairs_replays"]:
        out.append(f"start order: {m['start_pairs_simulated']} pairs the other way round against a replay, the "
                   f"replays {m['start_pairs_replays']} against each other")
    return out
