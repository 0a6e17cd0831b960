"""The files that come with optirack (rack files, traces, the demo's records), found by name from any directory.

In a checkout they are the repository's (topologies/, traces/, results/records/). `pip install` of the project puts
copies of them under <prefix>/share/optirack/ (setup.cfg, [options.data_files]), where a console script run from
anywhere finds them. A name is looked up, in order: as given (relative to the working directory, or absolute); under
the checkout; under the installed copy; and a bare file name (with or without its suffix) in the folder of its kind,
e.g. `paper-testbed` -> topologies/paper-testbed.yaml, `sample.csv` -> traces/sample.csv. No Ryu, no Docker: the
simulator imports this.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARE = Path(sysconfig.get_path("data")) / "share" / "optirack"
TOPOLOGIES, TRACES, RECORDS = "topologies", "traces", "results/records"


def roots() -> list[Path]:
    """Where bundled files are: the checkout (when this module runs from one), then the installed copy."""
    return [r for r in (REPO if (REPO / "setup.cfg").is_file() else None, SHARE) if r is not None]


def find(name: str | Path, folder: str | None = None, suffix: str = "") -> Path:
    """The file `name` refers to, or `name` itself where none is found (so the error names what was given)."""
    given = Path(name).expanduser()
    if given.is_absolute() or given.exists():
        return given
    tries = [given]
    if folder and len(given.parts) == 1:
        tries += [Path(folder) / given] + ([Path(folder) / f"{given}{suffix}"] if suffix and not given.suffix else [])
    for root in roots():
        for t in tries:
            if (root / t).is_file():
                return root / t
    return given


def directory(folder: str) -> Path:
    """The first root's `folder` that exists (the checkout's, else the installed copy's); the checkout's if none."""
    for root in roots():
        if (root / folder).is_dir():
            return root / folder
    return roots()[0] / folder


def rack(name: str | Path) -> Path:
    return find(name, TOPOLOGIES, ".yaml")


def trace(name: str | Path) -> Path:
    return find(name, TRACES, ".csv")


def bundled(relative: str) -> Path:
    """`relative` in the first root that has it (whatever the working directory), else in the first root."""
    return next((r / relative for r in roots() if (r / relative).is_file()), roots()[0] / relative)


DEFAULT_RACK = bundled("topologies/paper-testbed.yaml")
