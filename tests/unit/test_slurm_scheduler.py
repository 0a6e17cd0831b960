"""What the controller tells Slurm and asks it (controller/slurm/scheduler.py), topology.conf kept to the live circuits
(controller/slurm/topology.py, and the app's thread that calls it), and where a requeued job's ranks go on from
(controller/slurm/rank.py): on a fake runner of Slurm's commands that answers as Slurm 22.05 did on the emulated rack
(tests/data/slurm/)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from controller.apps import slurm_api
from controller.core.circuits import CircuitMap
from controller.slurm import rank
from controller.slurm.conf import topology_conf
from controller.slurm.scheduler import UNKNOWN, SchedulerError, SlurmScheduler
from controller.slurm.topology import TopologyKeeper
from tests.unit.test_slurm import RACK

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SHOW_NODE = (DATA / "scontrol-show-node.txt").read_text()  # srv2 DOWN with our reason


class Slurm:
    """Slurm's commands as a fake: `answers` maps a command's first words to (exit code, stdout, stderr)."""

    def __init__(self, **answers):
        self.answers = {tuple(k.split("_")): v for k, v in answers.items()}
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        for n in (3, 2, 1):
            if tuple(argv[:n]) in self.answers:
                rc, out, err = self.answers[tuple(argv[:n])]
                return subprocess.CompletedProcess(argv, rc, out, err)
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_a_lost_server_sets_its_node_down_with_the_reason():
    slurm = Slurm()
    SlurmScheduler(RACK, slurm).node_lost("12", "srv2", "the Docker Engine of server srv2 went down\n(refused)")
    assert slurm.calls == [["scontrol", "update", "NodeName=srv2", "State=DOWN",
                            "Reason=optirack: the Docker Engine of server srv2 went down (refused) (Slurm job 12)"]]


def test_bad_input_and_a_refusal_are_errors_that_say_what():
    slurm = Slurm(scontrol_update=(1, "", "slurm_update error: Invalid user id"))
    with pytest.raises(ValueError, match="'srv9' is not a server of rack paper"):
        SlurmScheduler(RACK, slurm).node_lost("12", "srv9", "gone")
    assert slurm.calls == []  # nothing asked of Slurm
    with pytest.raises(SchedulerError, match="scontrol update NodeName=srv2 State=DOWN .*Invalid user id"):
        SlurmScheduler(RACK, slurm).node_lost("12", "srv2", "gone")


@pytest.mark.parametrize("state, reason, resumed", [
    ("DOWN+NOT_RESPONDING", None, True),  # the node we marked (tests/data: as scontrol showed it)
    ("DOWN", "Not responding", False),  # Slurm's own verdict: left to Slurm
    ("DOWN", "maintenance: PSU", False),  # an administrator's
    ("IDLE", None, False),  # back already (resumed by hand, or Slurm found it responding again)
])
def test_a_server_back_resumes_its_node_only_if_we_took_it_down(state, reason, resumed):
    shown = SHOW_NODE.replace("State=DOWN+NOT_RESPONDING", f"State={state}")
    if reason:
        shown = "\n".join(f"   Reason={reason} [slurm@2026-11-28T17:00:00]" if x.strip().startswith("Reason=") else x
                          for x in shown.splitlines())
    slurm = Slurm(scontrol_show_node=(0, shown, ""))
    SlurmScheduler(RACK, slurm).node_back("srv2")
    assert (["scontrol", "update", "NodeName=srv2", "State=RESUME"] in slurm.calls) == resumed


def test_the_node_reason_is_read_without_slurms_stamp():
    state, reason = SlurmScheduler(RACK, Slurm(scontrol_show_node=(0, SHOW_NODE, ""))).node_state("srv2")
    assert state.startswith("DOWN") and reason.startswith("optirack: ") and "[" not in reason


def test_ended_jobs_are_found_in_squeue_then_sacct():
    squeue = "\n".join(["1|RUNNING", "2|COMPLETED", "3|PENDING", "4|COMPLETING", "5|CONFIGURING", "7|COMPLETING",
                        "8|TIMEOUT", "99|RUNNING"])
    sacct = "4|COMPLETED\n6|CANCELLED by 0\n7|RUNNING\n"
    slurm = Slurm(squeue=(0, squeue, ""), sacct=(0, sacct, ""))
    ended = SlurmScheduler(RACK, slurm).ended(["1", "2", "3", "4", "5", "6", "7", "8", "10"])
    assert ended == {"2": "COMPLETED", "3": "PENDING (requeued)", "4": "COMPLETED", "6": "CANCELLED by 0",
                     "8": "TIMEOUT", "10": UNKNOWN}  # 1, 5 run; 7 is still completing
    sacct_call = next(c for c in slurm.calls if c[0] == "sacct")
    assert sacct_call[-1] == "4,6,7,10"  # only those squeue could not settle
    assert SlurmScheduler(RACK, Slurm()).ended([]) == {}


def test_ended_raises_when_slurmctld_does_not_answer_and_sacct_off_is_not_an_error():
    down = Slurm(squeue=(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"))
    with pytest.raises(SchedulerError, match="Unable to contact slurm controller"):
        SlurmScheduler(RACK, down).ended(["1"])
    no_accounting = Slurm(squeue=(0, "1|RUNNING\n", ""), sacct=(1, "", "Slurm accounting storage is disabled"))
    assert SlurmScheduler(RACK, no_accounting).ended(["1", "2"]) == {"2": UNKNOWN}


# --- topology.conf ------------------------------------------------------------------------------------------------
MOVED = CircuitMap.parse(RACK, [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:14"],
                                ["ocs1:4", "ocs1:15"], ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]])


def _keeper(tmp_path, slurm, circuits, plugin=True):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n" + ("TopologyPlugin=topology/tree\n" if plugin else ""))
    (tmp_path / "topology.conf").write_text(topology_conf(RACK, CircuitMap.initial(RACK)))
    return TopologyKeeper(RACK, conf, lambda: circuits[0], run=slurm)


def test_the_tree_is_written_and_reloaded_only_when_it_changed(tmp_path):
    slurm, circuits = Slurm(), [CircuitMap.initial(RACK)]
    keeper = _keeper(tmp_path, slurm, circuits)
    assert keeper.refresh() == "unchanged" and slurm.calls == []
    circuits[0] = MOVED
    assert keeper.refresh() == "reconfigured" and slurm.calls == [["scontrol", "reconfigure"]]
    assert keeper.path.read_text() == topology_conf(RACK, MOVED)
    assert keeper.refresh() == "unchanged" and len(slurm.calls) == 1
    status = keeper.status()
    assert status["reconfigures"] == 1 and status["unchanged"] == 2 and status["history"][0]["ok"]
    assert status["history"][0]["tree"][0] == "SwitchName=as1 Nodes=srv1,srv2,srv3,srv4"


def test_no_tree_plugin_means_nothing_is_kept_and_a_refused_reload_is_recorded(tmp_path):
    slurm, circuits = Slurm(scontrol_reconfigure=(1, "", "slurm_reconfigure error: Unable to contact")), [MOVED]
    assert _keeper(tmp_path, slurm, circuits, plugin=False).refresh() == "off" and slurm.calls == []
    keeper = _keeper(tmp_path, slurm, circuits)
    assert keeper.refresh() == "failed"
    assert keeper.status()["failed"] == 1 and "Unable to contact" in keeper.history[-1]["error"]


def test_a_refused_reload_is_tried_again_though_the_tree_did_not_change(tmp_path):
    """The file was written before the reload that failed, so "the same tree as the file's" no longer means that
    slurmctld holds it: the next refresh reloads, and an accepted reload ends that."""
    answers = [(1, "", "Unable to contact slurm controller"), (0, "", "")]

    def slurm(argv, timeout):
        calls.append(argv)
        code, out, err = answers.pop(0) if answers else (0, "", "")
        return subprocess.CompletedProcess(argv, code, out, err)

    calls: list[list[str]] = []
    keeper = _keeper(tmp_path, slurm, [MOVED])
    assert keeper.refresh() == "failed" and keeper.status()["stale"]
    assert keeper.refresh() == "reconfigured" and not keeper.status()["stale"] and len(calls) == 2
    assert keeper.refresh() == "unchanged" and len(calls) == 2


def test_the_apps_thread_retries_a_refused_reload_with_no_circuit_change(tmp_path, monkeypatch):
    now = [0.0]

    class Ctx:
        circuits_version = 1

    class Rt:
        sleeps = 0

        def sleep(self, s):
            now[0] += s
            Rt.sleeps += 1
            if now[0] > slurm_api.RECONFIGURE_RETRY_S + 1:
                raise _Stop

    answers = [1, 0]

    def slurm(argv, timeout):
        calls.append(now[0])
        return subprocess.CompletedProcess(argv, answers.pop(0) if answers else 0, "", "refused")

    calls: list[float] = []
    ctx = Ctx()
    ctx.rt = Rt()
    keeper = _keeper(tmp_path, slurm, [MOVED])
    keeper.clock = lambda: now[0]
    with pytest.raises(_Stop):
        slurm_api.keep_topology(ctx, keeper)
    assert len(calls) == 2 and calls[1] - calls[0] >= slurm_api.RECONFIGURE_RETRY_S  # once more, after the wait
    assert keeper.status()["reconfigures"] == 1 and keeper.status()["failed"] == 1 and not keeper.stale


class _Stop(Exception):
    pass


def test_changes_during_a_reload_are_folded_into_one_more_never_two_at_once(tmp_path):
    """The app's thread: a reload takes a while; three circuit changes land meanwhile; one more reload follows, with
    the tree of the last of them."""

    class Ctx:
        circuits_version = 1
        circuits = CircuitMap.initial(RACK)

    class Rt:
        sleeps = 0

        def sleep(self, s):
            Rt.sleeps += 1
            if Rt.sleeps > 5:
                raise _Stop

    ctx = Ctx()
    ctx.rt = Rt()
    ctx.circuits = MOVED

    def slow_reload(argv, timeout):
        calls.append(keeper.in_flight)
        if len(calls) == 1:  # while the first reload runs, the circuits change three times, back to the start
            for _ in range(3):
                ctx.circuits_version += 1
            ctx.circuits = CircuitMap.initial(RACK)
        return subprocess.CompletedProcess(argv, 0, "", "")

    calls: list[int] = []
    keeper = _keeper(tmp_path, slow_reload, [None])
    keeper.circuits = lambda: ctx.circuits
    with pytest.raises(_Stop):
        slurm_api.keep_topology(ctx, keeper)
    assert calls == [1, 1] and keeper.most_in_flight == 1  # two reloads, one at a time
    assert keeper.path.read_text() == topology_conf(RACK, CircuitMap.initial(RACK))


# --- a requeued job's ranks ---------------------------------------------------------------------------------------
def test_a_requeued_job_goes_on_from_the_newest_checkpoint_every_rank_saved(tmp_path):
    for r, its in {0: (10, 15), 1: (10, 15), 2: (5, 10)}.items():  # rank 2 had not saved 15 when the node died
        (tmp_path / f"rank-{r}").mkdir()
        for k in its:
            (tmp_path / f"rank-{r}" / f"iter-{k}.bin").write_bytes(b"x")
    assert rank.newest_checkpoint(tmp_path, 3) == 10
    assert rank.newest_checkpoint(tmp_path, 4) == 0  # rank 3 saved nothing: start again
    p = {"world_size": 3}
    assert rank.checkpoint_argv(p, str(tmp_path), 5) == [
        "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "5", "--checkpoint-port", "0",
        "--resume-from", "10", "--restore-from", "local"]
    assert rank.checkpoint_argv({"world_size": 3}, str(tmp_path / "new"), 5)[-2:] == ["--checkpoint-port", "0"]
    assert rank.checkpoint_argv(p, None, 5) == []


# --- at start: the nodes left down by a controller before this one ---------------------------------------------
def test_a_started_controller_resumes_the_nodes_left_down_for_servers_that_answer():
    slurm = Slurm(scontrol_show_node=(0, SHOW_NODE, ""))  # every node: down, for our reason
    assert SlurmScheduler(RACK, slurm).resume_answering(lambda s: s != "srv4") == ["srv1", "srv2", "srv3"]
    assert [c[2] for c in slurm.calls if c[-1] == "State=RESUME"] == ["NodeName=srv1", "NodeName=srv2",
                                                                        "NodeName=srv3"]  # srv4 is still dead


def test_the_app_tries_again_while_slurm_does_not_answer():
    slurm = Slurm(scontrol_show_node=(1, "", "slurm_load_node error: Unable to contact slurm controller"))
    slept: list[float] = []

    def sleep(s):
        slept.append(s)
        if len(slept) == 2:
            slurm.answers[("scontrol", "show", "node")] = (0, SHOW_NODE, "")

    slurm_api.resume_left_down(SlurmScheduler(RACK, slurm), lambda s: s == "srv2", sleep, retry_s=7)
    assert slept == [7, 7] and slurm.calls[-1] == ["scontrol", "update", "NodeName=srv2", "State=RESUME"]
