"""The Docker Engines of a rack's servers: one client per engine (local, tcp:// with mutual TLS,
or ssh://), and which engines answer now.

A client is made on first use and kept; an engine that does not answer is marked down with the
reason and asked again later, so placement can avoid its GPUs and a job on it can fail at once.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from controller.core.rack import Rack
from controller.jobs.ports import RETURNING, EngineDown

LOG = logging.getLogger("optirack.engines")
PING_TIMEOUT = 3.0
API_TIMEOUT = 120
API_VERSION = "1.41"  # Docker 20.10's, the oldest engine we support; newer engines speak it too


def _tls_config(rack: Rack):
    import docker

    tls = rack.spec.engines.tls
    if tls is None:
        return None
    for field, path in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)):
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"engines.tls.{field}: {path} does not exist (the emulated rack's are made by rack-up)"
            )
    return docker.tls.TLSConfig(client_cert=(tls.cert, tls.key), ca_cert=tls.ca, verify=True)


def engine_client(rack: Rack, server: str, timeout: float = API_TIMEOUT):
    """A Docker SDK client for one server's engine, as its rack file names it."""
    import docker

    url = rack.servers[server].docker
    if url == "local":
        return docker.from_env(timeout=timeout)
    if url.startswith("ssh://"):
        client = docker.DockerClient(base_url=url, timeout=timeout, use_ssh_client=True, version=API_VERSION)
    else:
        client = docker.DockerClient(
            base_url="https://" + url[len("tcp://") :], tls=_tls_config(rack), timeout=timeout, version=API_VERSION
        )
    # requests lets REQUESTS_CA_BUNDLE (set on many hosts) override the engine's CA: ignore the
    # environment, as the engines are reached directly.
    client.api.trust_env = False
    return client


class Engines:
    """Clients for every server's engine, and their health as last seen."""

    def __init__(self, rack: Rack, make_client: Callable[[str, float], object] | None = None):
        self.rack = rack
        self._make = make_client or (lambda server, timeout: engine_client(rack, server, timeout))
        self._clients: dict[tuple[str, float], object] = {}
        self._down: dict[str, str] = {}  # server -> why, as last seen
        self._returning: set[str] = set()  # down, now answering, not yet swept
        self._lock = threading.Lock()

    def url(self, server: str) -> str:
        return self.rack.servers[server].docker

    def client(self, server: str, timeout: float = API_TIMEOUT):
        """The server's client; raises EngineDown if it cannot even be made."""
        key = (server, timeout)
        with self._lock:
            if key not in self._clients:
                try:
                    self._clients[key] = self._make(server, timeout)
                except Exception as e:  # noqa: BLE001 (bad certificate path, ssh missing, ...)
                    raise EngineDown(server, self.url(server), f"{e.__class__.__name__}: {e}") from None
            return self._clients[key]

    def ping(self, server: str) -> bool:
        """Ask the engine now; record and return whether it answered."""
        try:
            self.client(server, PING_TIMEOUT).ping()
        except Exception as e:  # noqa: BLE001 (refused, timed out, TLS, ...: down, with the reason)
            why = str(e.why) if isinstance(e, EngineDown) else f"{e.__class__.__name__}: {_short(e)}"
            if e.__class__.__name__ == "ReadTimeout":  # it took the connection and said nothing: hung, not gone
                why = f"ReadTimeout: connected, no answer within {PING_TIMEOUT:g} s (hung)"
            if server not in self._down or server in self._returning:
                LOG.error("the engine of %s (%s) is down: %s", server, self.url(server), why)
            self._returning.discard(server)
            self._down[server] = why
            return False
        if server in self._down:
            # Still not usable: what it ran before it went down is removed first (the watch of the engines
            # sweeps it, then calls mark_up); until then every caller is told it is down, with that reason.
            if server not in self._returning:
                LOG.warning("the engine of %s (%s) answers again", server, self.url(server))
                self._returning.add(server)
                self._down[server] = RETURNING
            return False
        return True

    def answers(self, server: str, timeout: float) -> bool:
        """Whether the engine answers within `timeout` s; records nothing (the failure detector's probe)."""
        try:
            self.client(server, timeout).ping()
        except Exception:  # noqa: BLE001 (refused, timed out, ...: it did not answer)
            return False
        return True

    def check(self, servers) -> None:
        """Raise EngineDown naming the first of `servers` whose engine does not answer now."""
        for server in sorted(set(servers)):
            if not self.ping(server):
                raise EngineDown(server, self.url(server), self._down[server])

    def down_servers(self) -> dict[str, str]:
        """Servers whose engine did not answer when last asked: server -> why."""
        return dict(self._down)

    def mark_down(self, server: str, why: str) -> None:
        self._returning.discard(server)
        self._down[server] = why

    def returning(self) -> list[str]:
        """Servers whose engine answers again, not yet swept of what they ran before (shown down until then)."""
        return sorted(self._returning)

    def mark_up(self, server: str) -> None:
        """A returning server was swept: usable again."""
        self._returning.discard(server)
        self._down.pop(server, None)


def _short(e: Exception) -> str:
    text = str(e)
    for marker in (
        "Connection refused",
        "timed out",
        "No route to host",
        "CERTIFICATE_VERIFY_FAILED",
        "certificate",
        "Name or service not known",
    ):
        if marker in text:
            return marker.lower() if marker != "CERTIFICATE_VERIFY_FAILED" else "TLS certificate not trusted"
    return text[:200]
