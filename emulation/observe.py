"""Real observers of a running controller, for tests and benchmarks: Prometheus scraping /metrics, and
headless Chromium showing the live page. Each is a child process with its own files, stopped on exit.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import requests

from emulation.harness import free_port, wait_for

CHROMIUM = "/usr/bin/chromium"
# Flags that let Chromium start on a machine with no network but loopback, as root, without a display.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


class Prometheus:
    """Debian's `prometheus`, scraping `targets` (host:port) at /metrics into its own storage, on a loopback port."""

    def __init__(self, workdir: Path, targets: list[str], scrape_interval: str = "1s", binary: str = "prometheus"):
        self.dir = Path(workdir) / "prometheus"
        self.targets, self.scrape_interval, self.binary = targets, scrape_interval, binary
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        targets = ", ".join(f'"{t}"' for t in self.targets)
        return (
            f"global:\n  scrape_interval: {self.scrape_interval}\n  evaluation_interval: {self.scrape_interval}\n"
            f"scrape_configs:\n  - job_name: optirack\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{targets}]\n"
        )

    def __enter__(self) -> Prometheus:
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"{self.binary} is not installed (Debian package prometheus; make setup installs it)")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "prometheus.yml").write_text(self.config())
        log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        try:
            wait_for(self._ready, 30, "Prometheus to be ready", interval=0.2)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log()[-2000:]}")
        try:
            return requests.get(self.url + "/-/ready", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def log(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query through the HTTP API: the result's series, each {"metric": {...}, "value": [t, "v"]}."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        resp = requests.get(self.url + "/api/v1/query", params=params, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def wait_scraped(self, timeout: float = 30) -> None:
        """Until every target has been scraped successfully at least twice."""
        wait_for(
            lambda: (
                len([s for s in self.query('count_over_time(up{job="optirack"}[1m])') if float(s["value"][1]) >= 2])
                == len(self.targets)
                and all(s["value"][1] == "1" for s in self.query('up{job="optirack"}'))
            ),
            timeout,
            "Prometheus to scrape the controller",
        )

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Browser:
    """Debian's Chromium, headless, driven by Playwright, with a fresh profile that is removed on exit."""

    def __init__(self, width: int = 1400, height: int = 1000, executable: str = CHROMIUM):
        self.size, self.executable = {"width": width, "height": height}, executable
        self.profile: str | None = None
        self._pw = self.context = self.page = None

    def __enter__(self) -> Browser:
        from playwright.sync_api import sync_playwright  # a dev dependency: only tests and benchmarks need it

        if not Path(self.executable).exists():
            raise RuntimeError(f"{self.executable} is missing (Debian package chromium; make setup installs it)")
        self.profile = tempfile.mkdtemp(prefix="optirack-chromium-")
        self._pw = sync_playwright().start()
        try:
            self.context = self._pw.chromium.launch_persistent_context(
                self.profile, executable_path=self.executable, headless=True, args=CHROMIUM_FLAGS, viewport=self.size
            )
            self.page = self.context.new_page()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.context is not None:
                self.context.close()
        finally:
            if self._pw is not None:
                self._pw.stop()
            if self.profile:
                shutil.rmtree(self.profile, ignore_errors=True)
