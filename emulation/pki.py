"""Certificates for the emulated rack's engines and registry: a CA, one server certificate per
address, and the controller's client certificate, made with `openssl` (argument lists only).

A plain TCP Docker Engine is root for anyone who reaches it, so every emulated engine listens
with mutual TLS, as a lab's should. The CA and the client pair are kept (the rack file names
them); a server certificate is made again when its address is not the one it was made for.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

DAYS = "3650"
CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


class PkiError(RuntimeError):
    pass


def _openssl(*args: str) -> str:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def ensure_ca(ca: Path) -> Path:
    """The CA certificate at `ca`, its key beside it (ca-key.pem); made once. Returns the key's path."""
    key = ca.with_name("ca-key.pem")
    if ca.exists() and key.exists():
        return key
    ca.parent.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *CURVE, "-keyout", str(key), "-out", str(ca), "-days", DAYS,
             "-subj", "/CN=optirack emulated rack CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _private(key)
    return key


def _sign(ca: Path, cert: Path, key: Path, subject: str, extensions: list[str]) -> None:
    cert.parent.mkdir(parents=True, exist_ok=True)
    csr, ext = cert.with_suffix(".csr"), cert.with_suffix(".ext")
    _openssl("req", *CURVE, "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _private(key)
    ext.write_text("\n".join(extensions) + "\n")
    try:
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca.with_name("ca-key.pem")),
                 "-CAcreateserial", "-out", str(cert), "-days", DAYS, "-extfile", str(ext))
    finally:
        csr.unlink(missing_ok=True)
        ext.unlink(missing_ok=True)


def _made_for(cert: Path, marker: str) -> bool:
    stamp = cert.with_suffix(".for")
    return cert.exists() and stamp.exists() and stamp.read_text() == marker


def ensure_server(ca: Path, cert: Path, key: Path, ip: str) -> None:
    """A server certificate for `ip` (its only subject alternative name), signed by the CA."""
    marker = f"{ip} {ca.stat().st_mtime_ns}"
    if _made_for(cert, marker) and key.exists():
        return
    _sign(ca, cert, key, f"/CN={ip}", [f"subjectAltName=IP:{ip}", "extendedKeyUsage=serverAuth",
                                       "keyUsage=critical,digitalSignature,keyAgreement"])
    cert.with_suffix(".for").write_text(marker)


def ensure_client(ca: Path, cert: Path, key: Path) -> None:
    """The controller's client certificate (also presented to the registry by this host's engines)."""
    marker = f"client {ca.stat().st_mtime_ns}"
    if _made_for(cert, marker) and key.exists():
        return
    _sign(ca, cert, key, "/CN=optirack controller", ["extendedKeyUsage=clientAuth",
                                                     "keyUsage=critical,digitalSignature,keyAgreement"])
    cert.with_suffix(".for").write_text(marker)
