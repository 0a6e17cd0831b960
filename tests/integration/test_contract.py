"""The OpenAPI document is the contract: schemathesis, with all its checks, against the live
controller on the emulated rack, without the token (nothing may change) and with it (jobs are
submitted and circuits changed for real; st_hooks.py keeps the jobs idle, the `bed` fixture stops
them). The README gives the longer, independent run (1,000+ requests) with the same command."""
from __future__ import annotations

import os
import re
import subprocess
from collections import Counter

from tests.integration.helpers import BIN, ROOT
from tests.integration.testbed import device_circuits

SEED = "20261123"  # fixed, so a failure here is reproducible with the printed command


def schemathesis(bed, tmp_path, name: str, examples: int, token: bool) -> tuple[int, str, Counter]:
    """Run `st run` with all checks; returns its exit code, its output's tail, and the statuses it was answered."""
    url = bed.controller.url + "/api/v1"
    report = tmp_path / f"{name}.ndjson"
    cmd = [str(BIN / "st"), "--config-file", str(ROOT / "schemathesis.toml"), "run", f"{url}/openapi.json",
           "--url", url, "--checks", "all", "--workers", "1", "--max-examples", str(examples), "--seed", SEED,
           "--report", "ndjson", "--report-ndjson-path", str(report)]
    if token:
        cmd += ["--header", f"Authorization: Bearer {bed.client.token}"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.integration.st_hooks", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=540)
    out = proc.stdout + proc.stderr
    statuses = Counter(re.findall(r'"status_code":\s*(\d+)', report.read_text() if report.exists() else ""))
    print(f"schemathesis {name}: exit {proc.returncode}, {sum(statuses.values())} requests, answered "
          + ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())))
    return proc.returncode, out[-6000:], statuses


def _state(bed) -> tuple:
    client = bed.client
    return (client.get("/jobs")["jobs"], client.get("/ocs/circuits")["circuits"], client.get("/events", limit=100000),
            device_circuits(bed.rack), sorted(c.name for _, c in bed.containers()))


def test_without_the_token_the_api_keeps_its_contract_and_changes_nothing(bed, tmp_path):
    before = _state(bed)
    rc, out, statuses = schemathesis(bed, tmp_path, "anonymous", 30, token=False)
    assert rc == 0, out
    assert sum(statuses.values()) > 300 and statuses["401"] > 0, (statuses, out)
    assert _state(bed) == before, "a request without the token changed the rack"


def test_with_the_token_the_api_keeps_its_contract(bed, tmp_path):
    rc, out, statuses = schemathesis(bed, tmp_path, "with-token", 15, token=True)
    assert rc == 0, out
    assert sum(statuses.values()) > 300, (statuses, out)
    assert statuses["201"] > 0 and statuses["200"] > 0, f"the fuzzer never got a mutation through: {statuses}"
