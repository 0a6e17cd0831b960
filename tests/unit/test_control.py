"""The controller's command to a worker (controller/drivers/control.py) as the worker reads it
(containers/session.py: Control): unpacked where the engine unpacks it, in the control directory's parent, it makes
the directory itself, so a warm spare told its rank before its worker has made the directory still finds it."""
import io
import tarfile

from containers.session import Control
from controller.drivers import control


def test_a_regroup_archive_unpacked_in_the_parent_is_the_command_the_worker_reads(tmp_path):
    assert control.CONTROL == f"{control.CONTROL_PARENT}/{control.CONTROL_NAME}"
    for attempt, argv in ((1, ["--rank", "2"]), (3, ["--rank", "0", "--resume-from", "14"])):
        with tarfile.open(fileobj=io.BytesIO(control.regroup_archive(attempt, argv))) as tar:
            tar.extractall(tmp_path)  # no directory there yet the first time, as in a starting spare
    seen = Control(str(tmp_path / control.CONTROL_NAME))
    assert seen.regroup(0) == {"argv": ["--rank", "0", "--resume-from", "14"]}  # the newest after attempt 0
    assert seen.regroup(2) == {"argv": ["--rank", "0", "--resume-from", "14"]}
    assert seen.regroup(3) is None
