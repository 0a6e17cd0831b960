"""The emulated rack's image registry: Debian's `docker-registry` as a process with a PID file (no
systemd here), on the management bridge, for as long as the rack is up; its storage is a cache.

It serves TLS with a certificate from the rack's CA and asks for a client certificate from the
same CA. Every Docker Engine on this host (the host's own, which pushes, and the emulated servers'
engines, which pull) reads `/etc/docker/certs.d/ADDR:PORT/` at each pull or push, so installing
the CA and the client pair there makes them trust it with no restart and no `--insecure-registry`
(which plain HTTP from a non-loopback address would need on every engine, the host's included).
"""
from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from controller.core.rack import Rack
from emulation.engines import CACHE_DIR, RUN_DIR, EngineError, bridge_ip

STORAGE = CACHE_DIR / "registry"
HERE = RUN_DIR / "registry"
CERTS_D = Path("/etc/docker/certs.d")


def address(rack: Rack) -> str:
    return rack.spec.engines.registry


def certs_dir(addr: str) -> Path:
    return CERTS_D / addr


def _config(rack: Rack, addr: str) -> str:
    ca = Path(rack.spec.engines.tls.ca)
    return "\n".join([
        "version: 0.1",
        "log: {level: warn, accesslog: {disabled: true}}",
        f"storage: {{filesystem: {{rootdirectory: {STORAGE}}}, delete: {{enabled: true}}}}",
        "http:",
        f"  addr: {addr}",
        "  tls:",
        f"    certificate: {ca.with_name('registry.pem')}",
        f"    key: {ca.with_name('registry-key.pem')}",
        f"    clientcas: [{ca}]",
    ]) + "\n"


def trust(rack: Rack) -> None:
    """Let this host's engines trust the registry and present the client certificate to it."""
    tls, d = rack.spec.engines.tls, certs_dir(address(rack))
    d.mkdir(parents=True, exist_ok=True)
    for src, name in ((tls.ca, "ca.crt"), (tls.cert, "client.cert"), (tls.key, "client.key")):
        (d / name).write_bytes(Path(src).read_bytes())
    os.chmod(d / "client.key", 0o600)


def pid() -> int | None:
    try:
        p = int((HERE / "registry.pid").read_text())
        cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return p if b"docker-registry" in cmdline else None


def start(rack: Rack, timeout: float = 20.0) -> None:
    """Start the registry (if it is not running) and wait until it answers."""
    addr = address(rack)
    if addr.rsplit(":", 1)[0] != bridge_ip(rack):
        raise EngineError(f"engines.registry {addr} is not on the management bridge ({bridge_ip(rack)})")
    trust(rack)
    if pid() is None:
        HERE.mkdir(parents=True, exist_ok=True)
        STORAGE.mkdir(parents=True, exist_ok=True)
        (HERE / "config.yml").write_text(_config(rack, addr))
        with open(HERE / "registry.log", "ab") as log:
            proc = subprocess.Popen(["docker-registry", "serve", str(HERE / "config.yml")], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (HERE / "registry.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not answers(rack):
        if time.monotonic() > deadline:
            tail = (HERE / "registry.log").read_text(errors="replace")[-1000:]
            raise EngineError(f"the registry did not answer at https://{addr} within {timeout:g} s:\n{tail}")
        time.sleep(0.1)


def answers(rack: Rack) -> bool:
    tls = rack.spec.engines.tls
    ctx = ssl.create_default_context(cafile=tls.ca)
    ctx.load_cert_chain(tls.cert, tls.key)
    try:
        with urllib.request.urlopen(f"https://{address(rack)}/v2/", context=ctx, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stop() -> bool:
    p = pid()
    if p is None:
        (HERE / "registry.pid").unlink(missing_ok=True)
        return False
    os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{p}").exists() and time.monotonic() < deadline:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    if Path(f"/proc/{p}").exists():
        os.kill(p, signal.SIGKILL)
    (HERE / "registry.pid").unlink(missing_ok=True)
    return True


def untrust(addr: str) -> None:
    d = certs_dir(addr)
    for name in ("ca.crt", "client.cert", "client.key"):
        (d / name).unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:
        pass
