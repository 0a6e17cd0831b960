"""Commands to a running worker, handed to it as a file in its control directory (containers/worker.py: Control) by
the engine's archive upload: no agent, no process started in the container, one request."""

from __future__ import annotations

import io
import json
import tarfile
import time

CONTROL = "/tmp/optirack-control"  # the worker's --control-dir default, made by the worker at its start
# The archive is unpacked in the control directory's parent, which the image has, and holds the directory itself: a
# warm spare told its rank before its worker has started (still importing PyTorch) finds the command when it looks.
CONTROL_PARENT, CONTROL_NAME = CONTROL.rsplit("/", 1)


def regroup_archive(attempt: int, argv: list[str]) -> bytes:
    """A tar holding `optirack-control/regroup-<attempt>.json` (unpacked in CONTROL_PARENT): the worker leaves its
    ring and joins the attempt's with `argv`."""
    data = json.dumps({"argv": argv}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folder = tarfile.TarInfo(CONTROL_NAME)
        folder.type, folder.mtime, folder.mode = tarfile.DIRTYPE, int(time.time()), 0o755
        tar.addfile(folder)
        info = tarfile.TarInfo(f"{CONTROL_NAME}/regroup-{attempt}.json")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
