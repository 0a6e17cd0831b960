"""One failure stays one failure: a job left behind by a failed test is gone before the next test
starts. Runs an inner pytest session (pytester) on the shared testbed whose first test fails while
its job runs, whose second leaves a job without the cleaning fixture, whose fourth kills the
controller while its job runs, and whose third and fifth check, with the `bed` fixture, that they
start clean; then checks the devices itself."""
from __future__ import annotations

from tests.integration.testbed import device_circuits

INNER_CONFTEST = """
import pytest

from tests.integration import conftest as outer
from tests.integration.conftest import bed  # noqa: F401  (the fixture under test)


@pytest.fixture(scope="session")
def testbed():
    return outer._shared  # the outer session's testbed, already up
"""

INNER_TESTS = """
from controller.core.jobs import ACTIVE
from tests.integration.helpers import wait_for

LONG = {"iterations": 100000, "compute_seconds": 0.2}


def _start(client, gpus):
    job = client.post("/jobs", {"gpus": gpus, "policy": "fixed", "workload": LONG})["job"]
    wait_for(lambda: client.get("/jobs/" + job["id"])["job"]["iterations_done"] >= 1, 180, job["id"] + " to run")
    return job["id"]


def test_fails_while_its_job_runs(bed):
    job = _start(bed.client, ["gpu1", "gpu3"])
    assert bed.containers(), "the job's containers run"
    raise AssertionError("failing on purpose while " + job + " runs")


def test_leaves_a_job_running_without_the_fixture(testbed):
    _start(testbed.client, ["gpu2", "gpu4"])


def test_the_next_test_starts_clean(bed):
    jobs = bed.client.get("/jobs")["jobs"]
    assert [j["id"] for j in jobs if j["state"] in ACTIVE] == []
    assert bed.containers() == []


def test_kills_the_controller_while_its_job_runs(bed):
    _start(bed.client, ["gpu5", "gpu6"])
    bed.controller.proc.kill()
    raise AssertionError("failing on purpose with the controller dead")


def test_starts_clean_after_that_too(bed):
    test_the_next_test_starts_clean(bed)
    assert bed.client.get("/topology")["ocs"]["ocs1"]["connected"]
"""


def test_a_job_left_by_a_failed_test_is_gone_before_the_next_test(bed, pytester):
    known = {j["id"] for j in bed.client.get("/jobs")["jobs"]}
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-v")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*AssertionError: failing on purpose while job-* runs*",
                                 "*AssertionError: failing on purpose with the controller dead*"])
    client = bed.client
    jobs = {j["id"]: j for j in client.get("/jobs")["jobs"] if j["id"] not in known}
    assert len(jobs) == 3 and {j["state"] for j in jobs.values()} == {"stopped"}, jobs
    assert bed.containers() == []
    circuits = client.get("/ocs/circuits")["circuits"]
    assert circuits == sorted(bed.initial)
    assert device_circuits(bed.rack) == circuits  # the OCS bridge's own flows
    assert all(g["job"] is None for g in client.get("/topology")["gpus"].values())
