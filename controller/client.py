"""A small client of the controller's REST API (used by the CLI, the experiment runner and tests)."""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TOKEN_FILE = Path("/var/lib/optirack/token")


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str, field: str | None = None, body: dict | None = None):
        self.status, self.message, self.field, self.body = status, message, field, body or {}
        super().__init__(f"{status}: {field + ': ' if field else ''}{message}")


def find_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    """--token, else $OPTIRACK_TOKEN, else the token file (default: the controller's state directory)."""
    if token:
        return token
    if os.environ.get("OPTIRACK_TOKEN"):
        return os.environ["OPTIRACK_TOKEN"]
    path = Path(token_file or os.environ.get("OPTIRACK_TOKEN_FILE") or DEFAULT_TOKEN_FILE)
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 120.0):
        self.url = (url or os.environ.get("OPTIRACK_URL") or DEFAULT_URL).rstrip("/") + "/api/v1"
        self.token, self.timeout = token, timeout
        import requests  # here, not at the top: what only wants ApiError or find_token starts without it

        self._requests = requests
        self.session = requests.Session()

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None, **params) -> dict:
        headers = {**({"Authorization": f"Bearer {self.token}"} if self.token else {}), **(headers or {})}
        try:
            resp = self.session.request(method, self.url + path, json=body, params=params or None,
                                        headers=headers, timeout=self.timeout)
        except self._requests.ConnectionError:
            raise ApiError(0, f"cannot reach the controller at {self.url} (is it running? make controller)") from None
        try:
            data = resp.json()
        except ValueError:
            data = {}
        if resp.status_code >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise ApiError(resp.status_code, err.get("message", resp.text.strip()[:200]), err.get("field"), data)
        return data

    def get(self, path: str, **params) -> dict:
        return self.request("GET", path, **params)

    def put(self, path: str, body: dict, headers: dict | None = None) -> dict:
        return self.request("PUT", path, body, headers)

    def post(self, path: str, body: dict | None = None) -> dict:
        return self.request("POST", path, body if body is not None else {})

    def delete(self, path: str) -> dict:
        return self.request("DELETE", path)
