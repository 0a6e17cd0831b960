"""scripts/setup.sh starts Open vSwitch and dockerd without the descriptors it inherited: a lock held around
`make setup` (`flock /tmp/optirack-rack.lock make demo`) must end with the command, not live on in the daemons
(it did: the next command under the lock waited for ever)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


def _function() -> str:
    text = SETUP.read_text()
    m = re.search(r"^exec_without_inherited_fds\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert m, "scripts/setup.sh has no exec_without_inherited_fds function"
    return m.group(0)


def test_a_daemon_started_by_setup_does_not_keep_an_inherited_descriptor(tmp_path):
    lock = tmp_path / "held.lock"
    lock.touch()
    script = _function() + f"""
exec 7<{lock}
exec_without_inherited_fds sleep 30 > /dev/null 2>&1 < /dev/null &
child=$!
(exec_without_inherited_fds sleep 0.2)  # in the foreground, in a subshell: the caller goes on
sleep 0.3
ls -l /proc/$child/fd
echo "caller still has: $(ls -l /proc/$$/fd | grep -c held.lock)"
kill $child
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert "/proc" not in out.stderr
    fds = re.findall(r" (\d+) -> (.*)$", out.stdout, re.M)
    assert fds, out.stdout  # the child's descriptors were listed
    assert str(lock) not in out.stdout, out.stdout
    assert {n for n, _ in fds} <= {"0", "1", "2"}, out.stdout
    assert "caller still has: 1" in out.stdout  # only the daemon lost it, not the script that started it


def test_without_the_function_the_child_keeps_it(tmp_path):
    """The check above can fail: a plain background child keeps fd 7."""
    lock = tmp_path / "held.lock"
    lock.touch()
    script = f"""
exec 7<{lock}
sleep 30 > /dev/null 2>&1 < /dev/null &
child=$!
sleep 0.3
ls -l /proc/$child/fd
kill $child
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=20)
    assert str(lock) in out.stdout, out.stdout
