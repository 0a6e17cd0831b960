"""The emulated NETCONF OCS's SSH side, as a lab's switch is reached: the project's own OpenSSH server (Debian's
`openssh-server`; the system's sshd is neither needed nor changed) on loopback, with its own config, host key, PID
file and port in the OCS's run directory, whose one allowed user may run nothing but yuma123's `netconf-subsystem`,
which hands the session to our netconfd's socket (`--ncxserver-sockname`). The user is a system account made for it
(`ensure_user`) and logs in with a key (an `authorized_keys` file in the run directory), or a password where a test
sets one; the client's known_hosts file gets the server's host key.
"""
from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SUBSYSTEM = "/usr/sbin/netconf-subsystem"
PRIVSEP = Path("/run/sshd")  # OpenSSH's compiled-in privilege-separation directory: it must exist


def listening(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def ensure_user(name: str) -> bool:
    """A system account `name` that may log in (a shell, no password, no home); True if it was made now."""
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh",
                    "--comment", "optirack emulated NETCONF OCS", name], check=True, capture_output=True)
    subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)  # no password, not locked
    return True


def remove_user(name: str, wait: float = 5) -> None:
    """Remove the account `name`, once the last of its sessions (ended by `netconf_ocs.stop`) has gone."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    deadline = time.monotonic() + wait
    while True:
        done = subprocess.run(["userdel", name], capture_output=True, text=True)
        if done.returncode == 0:
            return
        if done.returncode != 8 or time.monotonic() > deadline:  # 8: a process of the user still runs
            raise RuntimeError(f"userdel {name} exited {done.returncode}: {done.stderr.strip()}")
        time.sleep(0.1)


def set_password(name: str, password: str) -> None:
    subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True, capture_output=True)


def keygen(path: Path, comment: str) -> Path:
    """An ed25519 key pair at `path` (and path.pub), made if missing; returns the private key's path."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                       capture_output=True)
    return path


def write_known_hosts(path: Path, host: str, port: int, host_key: Path) -> None:
    """A known_hosts file holding the server's host key for [host]:port."""
    kind, key = Path(f"{host_key}.pub").read_text().split()[:2]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(f"[{host}]:{port} {kind} {key}\n")


def config(run_dir: Path, port: int, user: str, socket: Path) -> str:
    sub = f"{SUBSYSTEM} --ncxserver-sockname={port}@{socket}"
    return "\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {run_dir / 'ssh_host_ed25519_key'}",
        f"PidFile {run_dir / 'sshd.pid'}", f"AuthorizedKeysFile {run_dir / 'authorized_keys'}",
        f"AllowUsers {user}", "PermitRootLogin no", "UsePAM no", "PasswordAuthentication yes",
        "KbdInteractiveAuthentication no", "PermitTTY no", "AllowTcpForwarding no", "AllowAgentForwarding no",
        "X11Forwarding no", "PrintMotd no", "PermitUserRC no", "LogLevel INFO",
        f"Subsystem netconf {sub}", f"ForceCommand {sub}", ""])


def start(run_dir: Path, port: int, user: str, client_keys: list[Path], timeout: float = 10) -> int:
    """sshd on 127.0.0.1:`port` for `user`, who logs in with one of `client_keys` (public halves: .pub) and reaches
    the netconfd of `run_dir` (its socket ncxserver.sock). Returns sshd's PID once it listens."""
    run_dir = Path(run_dir)
    run_dir.chmod(0o755)  # the user's netconf-subsystem reaches the socket, sshd reads authorized_keys as the user
    PRIVSEP.mkdir(mode=0o755, exist_ok=True)
    keygen(run_dir / "ssh_host_ed25519_key", "optirack emulated OCS host key")
    (run_dir / "authorized_keys").write_text("".join(Path(f"{k}.pub").read_text() for k in client_keys))
    (run_dir / "authorized_keys").chmod(0o644)
    cfg = run_dir / "sshd_config"
    cfg.write_text(config(run_dir, port, user, run_dir / "ncxserver.sock"))
    subprocess.run([SSHD, "-t", "-f", str(cfg)], check=True, capture_output=True, text=True)
    subprocess.run([SSHD, "-f", str(cfg), "-E", str(run_dir / "sshd.log")], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    # sshd creates its PID file before it writes it: wait for a PID in it, not for the file
    while not (listening(port) and (pid := sshd_pid(run_dir))):
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port} (see {run_dir}/sshd.log)")
        time.sleep(0.05)
    return pid


def sshd_pid(run_dir: Path) -> int | None:
    try:
        pid = int((Path(run_dir) / "sshd.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None
