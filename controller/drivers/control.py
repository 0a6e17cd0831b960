"""Commands to a running worker, handed to it as a file in its control directory (containers/worker.py: Control) by
the engine's archive upload: no agent, no process started in the container, one request."""

from __future__ import annotations

import io
import json
import tarfile
import time

CONTROL = "/tmp/optirack-control"  # the worker's --control-dir default, made by the worker at its start


def regroup_archive(attempt: int, argv: list[str]) -> bytes:
    """A tar holding `regroup-<attempt>.json`: the worker leaves its ring and joins the attempt's with `argv`."""
    data = json.dumps({"argv": argv}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"regroup-{attempt}.json")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
