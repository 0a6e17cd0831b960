"""Where one emulated server's engine lives and listens (its address, roots, PID file): what emulation/engines.py
starts and emulation/engine_procs.py cleans up after, both importing it from here."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from controller.core.emulated import RUN_DIR

CACHE_DIR = Path(os.environ.get("OPTIRACK_CACHE_DIR", "/var/lib/optirack"))


@dataclass(frozen=True)
class EnginePlan:
    """Where one emulated server's engine lives and listens."""

    server: str
    ip: str
    port: int
    prefixlen: int

    @property
    def url(self) -> str:
        return f"tcp://{self.ip}:{self.port}"

    @property
    def leg(self) -> str:
        return f"mg-{self.server}"

    @property
    def data_root(self) -> Path:
        return CACHE_DIR / "engines" / self.server / "docker"

    @property
    def tls_dir(self) -> Path:
        return CACHE_DIR / "engines" / self.server / "tls"

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / "engines" / self.server

    @property
    def pidfile(self) -> Path:
        return self.run_dir / "dockerd.pid"
