"""Slurm's files from the rack file, the fabric as Slurm's tree, which GPUs Slurm gave a job, and each rank's place."""
from pathlib import Path

import pytest

from controller.core.circuits import CircuitMap
from controller.core.rack import load_rack
from controller.slurm import conf, rank
from controller.slurm.allocation import AllocationError, hostnames, indexes, parse

ROOT = Path(__file__).resolve().parents[2]
RACK = load_rack(ROOT / "topologies" / "paper-testbed.yaml")
LAYOUT = conf.Layout(Path("/run/optirack/slurm"))
SHOW = (ROOT / "tests" / "data" / "slurm" / "scontrol-show-job-d.txt").read_text()


def _slurm_conf(**kw) -> dict[str, list[str]]:
    text = conf.slurm_conf(RACK, LAYOUT, "vm", "198.19.0.254", {s: RACK.engine_host(s) for s in RACK.servers}, **kw)
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_each_server_is_a_node_with_its_gpus_as_gres_typed_by_model():
    c = _slurm_conf()
    assert c["SlurmctldHost"] == ["vm(198.19.0.254)"]
    nodes = {v.split()[0]: v for v in c["NodeName"]}
    assert list(nodes) == ["srv1", "srv2", "srv3", "srv4"]
    assert "NodeAddr=198.19.0.1 " in nodes["srv1"] and "Gres=gpu:m40:1,gpu:titanv:1" in nodes["srv1"]
    assert "Gres=gpu:m40:1 " in nodes["srv2"]
    assert c["GresTypes"] == ["gpu"] and c["TopologyPlugin"] == ["topology/tree"]
    assert "PrologSlurmctld" not in c  # no hook unless one is given


def test_hooks_and_accounting_are_configured_when_asked():
    c = _slurm_conf(prolog="/p", epilog="/e", dbd_port=6819)
    assert c["PrologSlurmctld"] == ["/p"] and c["EpilogSlurmctld"] == ["/e"]
    assert c["AccountingStorageType"] == ["accounting_storage/slurmdbd"]
    assert c["AccountingStorageTRES"] == ["gres/gpu,gres/gpu:m40,gres/gpu:titanv"]  # sacct's AllocTRES shows GPUs
    assert c["AccountingStoreFlags"] == ["job_comment"]
    assert _slurm_conf()["AccountingStorageType"] == ["accounting_storage/none"]


def test_gres_conf_lists_each_gpu_with_its_device_file_in_index_order():
    lines = [x for x in conf.gres_conf(RACK, LAYOUT).splitlines() if x.startswith("NodeName")]
    assert lines[:2] == [
        "NodeName=srv1 Name=gpu Type=m40 File=/run/optirack/slurm/nodes/srv1/dev/nvidia0",
        "NodeName=srv1 Name=gpu Type=titanv File=/run/optirack/slurm/nodes/srv1/dev/nvidia1",
    ]
    assert len(lines) == len(RACK.gpus)
    assert conf.gpu_at(RACK, "srv3", 1) == "gpu6" and conf.gpu_at(RACK, "srv2", 1) is None
    assert "NodeName=srv3 Name=gpu Type=titanv File=/dev/nvidia1" in conf.gres_conf(RACK)  # a lab's devices


def test_a_lab_gets_its_lines_from_the_command_and_a_bad_rack_file_exits_2(capsys, tmp_path):
    assert conf.main([str(ROOT / "topologies" / "paper-testbed.yaml"), "nodes"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "NodeName=srv1 Gres=gpu:m40:1,gpu:titanv:1"
    assert conf.main([str(tmp_path / "none.yaml"), "gres"]) == 2
    assert "none.yaml" in capsys.readouterr().err


def test_the_tree_follows_the_live_circuits():
    start = conf.topology_conf(RACK, CircuitMap.initial(RACK)).splitlines()[1:]
    assert start == ["SwitchName=as1 Nodes=srv1,srv2", "SwitchName=as2 Nodes=srv3,srv4",
                     "SwitchName=fabric Switches=as1,as2"]
    # gpu3 and gpu4 (srv3, srv4) rewired under as1 with gpu1, gpu2: srv4 moves; srv3 is split 1:1, kept by rack order
    moved = CircuitMap.parse(RACK, [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:13"], ["ocs1:3", "ocs1:14"],
                                    ["ocs1:4", "ocs1:15"], ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]])
    assert conf.leaf_of(RACK, moved) == {"srv1": "as1", "srv2": "as1", "srv3": "as1", "srv4": "as1"}
    assert conf.topology_conf(RACK, moved).splitlines()[1:] == ["SwitchName=as1 Nodes=srv1,srv2,srv3,srv4",
                                                                "SwitchName=fabric Switches=as1"]
    none = conf.topology_conf(RACK, CircuitMap()).splitlines()[1:]
    assert none == ["SwitchName=unwired Nodes=srv1,srv2,srv3,srv4", "SwitchName=fabric Switches=unwired"]


def test_host_lists_and_gres_indexes_expand():
    assert hostnames("srv[1-2,4],gpu7") == ["srv1", "srv2", "srv4", "gpu7"]
    assert hostnames("n[08-10]") == ["n08", "n09", "n10"]
    assert indexes("0-1,3") == [0, 1, 3]


def test_an_allocation_is_read_into_the_racks_gpus():
    alloc = parse(RACK, "1", SHOW)
    assert alloc.gpus == ["gpu1", "gpu2", "gpu4", "gpu3", "gpu6"]
    assert alloc.user == "root" and alloc.state == "CONFIGURING" and alloc.comment == "optirack:hold"
    with pytest.raises(AllocationError, match="not 2"):
        parse(RACK, "2", SHOW)
    with pytest.raises(AllocationError, match="node srv9 is not a server"):
        parse(RACK, "1", SHOW.replace("Nodes=srv3 ", "Nodes=srv9 "))


def test_each_task_gets_its_gpu_its_rank_and_rank_0s_nic_as_master():
    gpus = ["gpu1", "gpu2", "gpu3", "gpu4"]
    p = rank.plan(RACK, "srv3", {"CUDA_VISIBLE_DEVICES": "0", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "12"}, gpus)
    assert p == {"gpu": "gpu3", "rank": 2, "world_size": 4, "master": RACK.addresses["gpu1"][0], "port": 30012,
                 "ifname": "gpu3", "model": "M40"}
    # two GPUs of the job on one node and no single GPU bound to each task: by SLURM_LOCALID
    both = ["gpu1", "gpu5", "gpu3"]
    assert rank.plan(RACK, "srv1", {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_LOCALID": "1"}, both)["gpu"] == "gpu5"
    with pytest.raises(rank.RankError, match="one task per GPU"):
        rank.plan(RACK, "srv3", {"SLURM_LOCALID": "1"}, both)
    argv = rank.worker_argv(RACK, p, ["--iterations", "3"])
    assert argv[1:11] == ["--rank", "2", "--world-size", "4", "--master", RACK.addresses["gpu1"][0], "--master-port",
                          "30012", "--ifname", "gpu3"]
    assert argv[-2:] == ["--iterations", "3"]


def _fake_command(bin_dir: Path, name: str, fails: int, message: str) -> Path:
    """A stand-in for one of Slurm's clients: fails `fails` times printing `message`, then answers; counts calls."""
    calls = bin_dir / f"{name}.calls"
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho x >> {calls}\nn=$(wc -l < {calls})\n"
                      f"if [ \"$n\" -le {fails} ]; then echo '{message}' >&2; exit 1; fi\necho 42\n")
    script.chmod(0o755)
    return calls


def test_a_query_slurmctld_left_unanswered_is_asked_again_and_a_change_never(tmp_path, monkeypatch):
    from emulation import slurm

    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(slurm, "QUERY_PAUSE_S", 0.0)
    busy = "slurm_load_jobs error: Zero Bytes were transmitted or received"
    calls = _fake_command(tmp_path, "squeue", 2, busy)
    assert slurm.run("squeue", "--noheader").stdout.strip() == "42" and len(calls.read_text().split()) == 3
    calls = _fake_command(tmp_path, "sacct", 9, busy)  # never answers: the last error is raised, after 4 tries
    with pytest.raises(slurm.SlurmError, match="Zero Bytes"):
        slurm.run("sacct", "-X")
    assert len(calls.read_text().split()) == slurm.QUERY_ATTEMPTS
    calls = _fake_command(tmp_path, "sinfo", 1, "Invalid node name specified")  # a real error: asked once
    with pytest.raises(slurm.SlurmError, match="Invalid node name"):
        slurm.run("sinfo", "-n", "nope")
    assert len(calls.read_text().split()) == 1
    calls = _fake_command(tmp_path, "scontrol", 1, busy)  # a change (requeue) is never asked twice
    with pytest.raises(slurm.SlurmError, match="Zero Bytes"):
        slurm.run("scontrol", "requeue", "7")
    assert len(calls.read_text().split()) == 1
