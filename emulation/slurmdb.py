"""Accounting for the emulated rack's Slurm: a MariaDB of its own (data under the Slurm tree, on
127.0.0.1 at a port of its own) and slurmdbd on it, so that `sacct` shows what each job held
(AllocTRES with gres/gpu; Slurm keeps GPU TRES only with slurmdbd). Started before slurmctld,
stopped after it, by PID files; the data goes with the tree.
"""
from __future__ import annotations

import secrets
import subprocess

from controller.slurm import conf

DB_PORT = 3307  # not 3306: a lab machine may run its own MariaDB
DBD_PORT = 6819


def start(layout: conf.Layout, dbd_host: str, run, wait, pid_of) -> None:
    """mariadb-install-db, mariadbd, then slurmdbd (`run`, `wait` and `pid_of` are emulation.slurm's)."""
    db = layout.db
    password = secrets.token_hex(12)
    init = layout.root / "db-init.sql"
    init.write_text(
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n"
    )
    init.chmod(0o600)
    run("mariadb-install-db", "--no-defaults", f"--datadir={db}", "--user=root", "--skip-test-db",
        "--auth-root-authentication-method=socket", timeout=120)
    log = (layout.root / "mariadb.log").open("ab")
    subprocess.Popen(
        ["mariadbd", "--no-defaults", f"--datadir={db}", f"--socket={db / 'mysqld.sock'}", f"--port={DB_PORT}",
         "--bind-address=127.0.0.1", f"--pid-file={layout.root / 'mariadb.pid'}", "--user=root",
         f"--init-file={init}", "--skip-log-bin", "--innodb-buffer-pool-size=32M", "--skip-name-resolve"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    wait("MariaDB", lambda: pid_of(layout.root / "mariadb.pid", "mariadbd") and (db / "mysqld.sock").exists(), 60)
    layout.dbd_conf.write_text(conf.slurmdbd_conf(layout, dbd_host, DBD_PORT, DB_PORT, password))
    layout.dbd_conf.chmod(0o600)
    run("slurmdbd")
    wait("slurmdbd", lambda: pid_of(layout.root / "slurmdbd.pid", "slurmdbd") and _answers(run), 60)


def _answers(run) -> bool:
    return run("sacctmgr", "--noheader", "--parsable2", "show", "cluster", check=False).returncode == 0


def pids(layout: conf.Layout, pid_of) -> dict[str, int]:
    found = {}
    for name, path in (("slurmdbd", layout.root / "slurmdbd.pid"), ("mariadbd", layout.root / "mariadb.pid")):
        pid = pid_of(path, name)
        if pid:
            found[name] = pid
    return found
