"""Public traces replayed, jobs by duration, generated racks of any size, and bad inputs refused in one line."""
import json
from pathlib import Path

import pytest

from controller.cli import main as cli
from controller.core.rack import MAX_PORTS
from simulator.inputs import traces
from simulator.inputs.racks import RackOptions, choose_ocs, generate
from simulator.inputs.workloads import TraceError, fit
from simulator.model.engine import Options, Run, policies

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
PHILLY = DATA / "philly_cluster_job_log.json"
HELIOS = DATA / "helios_cluster_log.csv"
PAI = DATA / "pai_task_table.csv"
RACK = RackOptions(64, gpus_per_switch=16, gpus_per_server=4, oversubscription=4, models=(("V100", 1.0),))


def test_a_philly_job_log_imports_by_recorded_duration():
    imported = traces.load(PHILLY)
    assert imported.fmt == "philly"
    assert [j.gpus for j in imported.jobs] == [4, 2, 1, 16, 40]
    # first attempt's start to the last attempt's end (the third job ran twice, 14:00-14:25)
    assert [j.duration_s for j in imported.jobs] == [1800, 1200, 1500, 3600, 2400]
    assert [j.arrival_s for j in imported.jobs] == [0, 7200, 14400, 21600, 32400]
    assert imported.left_out == {"never ran or never ended": 1}
    assert all(j.iterations == 0 and j.model == "resnet50" for j in imported.jobs)


def test_a_helios_cluster_log_imports_and_leaves_out_cpu_jobs():
    imported = traces.load(HELIOS)
    assert imported.fmt == "helios"
    assert [(j.arrival_s, j.gpus, j.duration_s) for j in imported.jobs] == [
        (0, 1, 1800), (600, 8, 3600), (1200, 2, 1200), (1800, 16, 1800), (2400, 64, 600)]
    assert imported.left_out == {"no GPU (CPU jobs)": 1}


def test_an_acme_job_trace_imports_as_helios_does():
    imported = traces.load(DATA / "acme_trace_kalos.csv")
    assert imported.fmt == "helios"
    assert [(j.arrival_s, j.gpus, j.duration_s) for j in imported.jobs] == [(0, 64, 7200), (600, 8, 18)]
    assert imported.left_out == {"no GPU (CPU jobs)": 1, "no run time": 1}


def test_a_pai_task_table_imports_with_its_job_table_and_gpu_types():
    imported = traces.load(PAI)
    assert imported.fmt == "pai"
    jobs = {j.gpus: j for j in imported.jobs}
    # jobA: 2 instances of 1 GPU (its ps task has none); jobB: a quarter GPU taken whole; jobD: 4 x 2 GPUs
    assert sorted(jobs) == [1, 2, 8]
    assert jobs[2].duration_s == 1800 and jobs[2].gpu_model == "V100" and jobs[2].arrival_s == 0
    assert jobs[1].gpu_model == ""  # T4: not a model the simulator knows, so any GPU
    # jobD: submitted at 1300 (job table), its task ran 1310-4900; V100M32 read as V100
    assert jobs[8].arrival_s == 300 and jobs[8].duration_s == 3590 and jobs[8].gpu_model == "V100"
    assert imported.left_out == {"running or waiting when the trace ends": 1}


@pytest.mark.parametrize("path", [PHILLY, HELIOS, PAI])
def test_jobs_alone_on_the_fabric_keep_their_recorded_durations(path):
    """Derived iterations: a job alone runs within 1 % of its recorded duration; replayed: exactly."""
    rack = generate(RACK)
    jobs = fit(traces.load(path).jobs, len(rack.gpus), {"V100"}).jobs
    for mode in ("derived", "replayed"):
        result = Run(rack, jobs, policies(300)["regroup"], Options(durations=mode)).run()
        by_id = {j.id: j for j in jobs}
        alone = [r for r in result.jobs if not r.shared]
        assert alone, "the fixtures' jobs do not all overlap"
        for r in alone:
            ran = r.end_s - r.start_s
            assert ran == pytest.approx(by_id[r.id].duration_s, rel=0.01 if mode == "derived" else 1e-9)
            if mode == "derived":
                assert r.iterations >= 1 and r.mean_iteration_s == pytest.approx(r.alone_iteration_s, rel=1e-6)


def test_jobs_larger_than_the_rack_are_skipped_and_counted_or_refused_with_strict():
    jobs = traces.load(PHILLY).jobs
    kept = fit(jobs, 32, {"V100"})
    assert [j.gpus for j in kept.jobs] == [4, 2, 1, 16] and len(kept.skipped) == 1 and kept.types_dropped == 0
    pai = fit(traces.load(PAI).jobs, 32, {"A100"})  # the rack has no V100: such requests take any GPU, counted
    assert pai.types_dropped == 2 and not any(j.gpu_model for j in pai.jobs)
    assert "40 GPUs asked for; the rack has 32" in kept.skipped[0]
    with pytest.raises(TraceError, match="--strict"):
        fit(jobs, 32, {"V100"}, strict=True)


def test_simulate_replays_a_public_trace_and_says_what_it_left_out(tmp_path, capsys):
    out = tmp_path / "sim"
    args = ["simulate", "--gpus", "32", "--gpus-per-switch", "16", "--gpus-per-server", "4", "--trace", str(PHILLY),
            "--out", str(out), "--quiet", "--no-plots", "--policies", "fixed,regroup", "--workers", "1"]
    assert cli(args) == 0
    workload = json.loads((out / "results.json").read_text())["workload"]
    assert workload["format"] == "philly" and workload["jobs"] == 4 and workload["by_duration"] == 4
    assert workload["left_out"] == {"never ran or never ended": 1, "larger than the rack's 32 GPUs": 1}
    assert "derived from the workload" in workload["description"]
    capsys.readouterr()
    assert cli([*args, "--strict"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "job 6" in err and "gpus: 40 GPUs asked for" in err


@pytest.mark.parametrize("gpus, switches", [(8192, 256), (65536, 2048)])
def test_racks_of_8192_and_65536_gpus_build_with_datapath_ids_that_never_collide(gpus, switches):
    rack = generate(RackOptions(gpus))
    assert len(rack.gpus) == gpus and len(rack.aggregators()) == switches
    dpids = [o.dpid for o in rack.spec.ocs] + [s.dpid for s in rack.spec.switches]
    assert len(set(dpids)) == len(dpids)
    assert all(o.ports <= MAX_PORTS for o in rack.spec.ocs)


def test_small_racks_keep_the_paper_testbeds_numbering():
    rack = generate(RackOptions(64, gpus_per_switch=16))
    assert sorted(s.dpid for s in rack.spec.switches) == [0x201, 0x202, 0x203, 0x204, 0x300]


def test_the_ocs_count_fits_every_switch_on_every_ocs():
    assert choose_ocs(4096, 128, 2.0) == (16, 768)  # the shape earlier releases built
    ocs, ports = choose_ocs(16384, 512, 2.0)
    assert ports <= 1024 and 16384 % ocs == 0 and ports >= 512
    with pytest.raises(ValueError, match="raise --ocs-ports"):
        choose_ocs(65536, 2048, 2.0, ocs_ports=1024)


def _bytes(tmp_path, name, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "64", "--oversubscription", "0", "--jobs", "3"], "--oversubscription must be a positive number"),
        (["--gpus", "0", "--jobs", "3"], "--gpus must be a positive number of GPUs, not 0"),
        (["--gpus", "100", "--jobs", "3"], "try --gpus 96"),
        (["--gpus", "65536", "--gpus-per-switch", "32", "--ocs-ports", "1024", "--jobs", "3"], "raise --ocs-ports"),
        (["--gpus", "32", "--trace", "BIN"], "BIN: a binary file"),
        (["--case", "a", "--iterations", "1000000000000"], "--iterations must be between 1 and 100,000,000"),
        (["--gpus", "64", "--jobs", "3", "--defrag-interval", "nan"], "--defrag-interval must be positive"),
        (["--gpus", "32", "--trace", "LATIN1"], "LATIN1: line 2: not UTF-8"),
        (["--gpus", "32", "--trace", "SQUARE"], "SQUARE: line 2: gpus: '\u00b2' is not a positive integer"),
        (["--gpus", "32", "--trace", "HUGE"], "HUGE: line 2: iterations: 1,000,000,000,000 is more than"),
        (["--gpus", "32", "--trace", "BADPHILLY"], "BADPHILLY: line 1: not JSON"),
        (["--gpus", "32", "--trace", "BADHELIOS"], "BADHELIOS: line 2: submit_time: 'yesterday'"),
    ],
)
def test_every_bad_input_exits_2_with_one_line_naming_it(tmp_path, capsys, args, message):
    files = {
        "BIN": _bytes(tmp_path, "bin.csv", b"\x7fELF\x02\x01\x01\x00\x00\x00"),
        "LATIN1": _bytes(tmp_path, "latin.csv", b"arrival_s,gpus,model,iterations\n0,4,vgg16,10 \xe9\n"),
        "SQUARE": _bytes(tmp_path, "square.csv", "arrival_s,gpus,model,iterations\n0,\u00b2,vgg16,10\n".encode()),
        "HUGE": _bytes(tmp_path, "huge.csv", b"arrival_s,gpus,model,iterations\n0,4,vgg16,1000000000000\n"),
        "BADPHILLY": _bytes(tmp_path, "cluster_job_log.json", b"[{"),
        "BADHELIOS": _bytes(tmp_path, "cluster_log.csv",
                            b"job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,"
                            b"queue\n1,u,v,1,1,1,COMPLETED,yesterday,,,60,0\n"),
    }
    args = [files.get(a, a) for a in args]
    message = message.split(":")[0] in files and message.replace(message.split(":")[0], files[message.split(":")[0]],
                                                                   1) or message
    out = tmp_path / "sim"
    assert cli(["simulate", *args, "--out", str(out), "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert message in err
    assert not out.exists()


def test_a_spreadsheets_byte_order_mark_is_accepted(tmp_path):
    trace = _bytes(tmp_path, "bom.csv", "\ufeffarrival_s,gpus,model,duration_s\n0,4,vgg16,600\n".encode())
    (job,) = traces.load(trace).jobs
    assert job.duration_s == 600 and job.gpus == 4


def test_case_a_finds_its_rack_outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sim"
    assert cli(["simulate", "--case", "a", "--iterations", "3", "--out", str(out), "--quiet", "--no-plots",
                "--policies", "fixed", "--workers", "1"]) == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_on_random_traces_slowdown_is_at_least_1_exactly_1_alone_and_utilization_at_most_100(seed):
    import random

    from simulator.inputs.workloads import JobSpec
    from simulator.studies import metrics

    rng = random.Random(seed)
    rack = generate(RACK)
    jobs, t = [], 0.0
    for i in range(40):
        t += rng.expovariate(1 / 60)
        gpus, model = rng.choice([1, 2, 4, 8, 16, 24]), rng.choice(["vgg16", "resnet50"])
        jobs.append(JobSpec(f"j{i + 1}", round(t, 3), gpus, model, 0, duration_s=rng.uniform(5, 120)))
    for name in ("fixed", "regroup"):
        run = Run(rack, jobs, policies(300)[name], Options()).run()
        done = [j for j in run.jobs if not j.failed]
        assert len(done) == len(jobs)
        for j in done:
            assert metrics.slowdown(j) >= 1 - 1e-9
        if name == "fixed":  # no circuit changes: a job that never overlaps another runs exactly as alone
            lonely = [j for j in done if all(k is j or k.end_s <= j.arrival_s or k.arrival_s >= j.end_s for k in done)]
            assert lonely, "the trace has no job alone: pick another seed"
            for j in lonely:
                assert metrics.slowdown(j) == pytest.approx(1.0, abs=1e-9)
        s = metrics.summary(run, len(rack.gpus), 0.0)
        assert 0 < s["steady"]["computing"] <= s["steady"]["held"] <= 1 + 1e-9
        assert s["gpu_computing"] <= s["gpu_held"] <= 1 + 1e-9
        u = metrics.utilization(run, len(rack.gpus))
        assert max(u["held"]) <= 1 + 1e-9 and max(u["computing"]) <= 1 + 1e-9


def test_seeds_give_means_with_intervals_and_the_same_seed_the_same_files(tmp_path):
    args = ["simulate", "--gpus", "64", "--gpus-per-switch", "16", "--jobs", "30", "--seeds", "3", "--quiet",
            "--no-plots", "--policies", "fixed,regroup", "--workers", "1"]
    assert cli([*args, "--out", str(tmp_path / "a")]) == 0
    assert cli([*args, "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / x / "results.json").read_text()) for x in "ab")
    seeds = a["seeds"]
    assert seeds["n"] == 3 and seeds["seeds"] == [1, 2, 3]
    jct = seeds["policies"]["regroup"]["jct_mean"]
    assert jct["n"] == 3 and jct["ci95"] > 0
    for rec in (a, b):  # wall-clock fields aside
        rec.pop("command", None)
        for p in rec["policies"].values():
            p["summary"].pop("wall_s")
    assert a == b


def test_a_transformer_is_sized_from_its_parameter_count():
    from simulator.model import models

    small, large = models.parse("transformer:1e9"), models.parse("transformer:70e9")
    assert small.tensor_parallel("H100", 8, 64) == 1  # 16 GB of state fits an 80 GB GPU
    assert large.tensor_parallel("H100", 8, 64) == 8  # 1.1 TB of state: the whole server, and more
    c = models.cost("transformer:70e9", ["H100"] * 16, 8, 2400 * 1.25e8, 100 * 1.25e8)
    assert c.tensor_parallel == 8 and c.gradient_bytes == pytest.approx(2 * 70e9 / 8)
    # 6 P x tokens FLOPs at 40 % of 989 TFLOPS, plus the tensor-parallel all-reduces over NVLink
    assert min(c.compute_s) > 6 * 70e9 * models.TOKENS_PER_GPU / (989e12 * 0.4)
    with pytest.raises(ValueError, match="parameter count"):
        models.parse("transformer:lots")


def test_an_nvlink_domain_keeps_a_servers_ring_off_the_nics_and_ideal_removes_shared_links():
    from simulator.inputs.workloads import JobSpec

    rack = generate(RackOptions(64, gpus_per_switch=16, models=(("H100", 1.0),)))
    jobs = [JobSpec("j1", 0, 8, "transformer:7e9", 5), JobSpec("j2", 0, 32, "resnet50", 5)]
    nic = Run(rack, jobs, policies(300)["fixed"], Options()).run().jobs
    nvlink = Run(rack, jobs, policies(300)["fixed"], Options(nvlink_gbps=2400)).run().jobs
    assert nvlink[0].mean_iteration_s < 0.5 * nic[0].mean_iteration_s  # one server: all flows over NVLink
    # across servers a flat ring's step is as slow as its flows through the NICs: no faster
    assert nvlink[1].mean_iteration_s == pytest.approx(nic[1].mean_iteration_s)
    fixed = Run(rack, jobs, policies(300)["fixed"], Options()).run()
    ideal = Run(rack, jobs, policies(300)["ideal"], Options()).run()
    assert not any(j.shared for j in ideal.jobs)
    assert all(b.jct_s <= a.jct_s + 1e-9 for a, b in zip(fixed.jobs, ideal.jobs, strict=True))


def test_plots_draw_equal_curves_once_and_label_them_together():
    from simulator.cli.plots import _groups

    record = {"policies": {"fixed": {"v": [1, 2]}, "regroup": {"v": [1, 3]}, "defrag": {"v": [1, 3]}}}
    assert _groups(record, lambda p: p["v"]) == [(["fixed"], [1, 2]), (["regroup", "defrag"], [1, 3])]


@pytest.mark.parametrize("sharing", ["maxmin", "held"])
def test_two_rings_sharing_one_uplink_match_the_hand_computed_max_min_rate(sharing):
    """Two 8-GPU vgg16 rings, each half under switch a1 and half under a2, start together: each ring
    sends one flow a1 -> a2 and one back, so every uplink direction carries one flow of each. Max-min
    gives each ring half the 100 Gbit/s uplink (its NICs could take all of it): 50 Gbit/s x efficiency."""
    from profiles import WORKLOADS, compute_seconds
    from simulator.inputs.workloads import JobSpec
    from simulator.model.network import GBPS, NetParams

    rack = generate(RackOptions(32, gpus_per_switch=8, gpus_per_server=4, oversubscription=8,
                                models=(("V100", 1.0),), spare=1.0))
    a = tuple(f"g{i}" for i in (1, 2, 3, 4, 9, 10, 11, 12))
    b = tuple(f"g{i}" for i in (5, 6, 7, 8, 13, 14, 15, 16))
    jobs = [JobSpec("a", 0.0, 8, "vgg16", 50, a, "fixed"), JobSpec("b", 0.0, 8, "vgg16", 50, b, "fixed")]
    net = NetParams(efficiency=0.9, step_latency_s=20e-6, sharing=sharing)
    run = Run(rack, jobs, policies(300)["fixed"], Options(net=net, step_model="exact")).run()
    rate = 0.5 * 100 * GBPS * 0.9
    n, size = 8, WORKLOADS["vgg16"].gradient_bytes
    by_hand = compute_seconds("vgg16", "V100") + 2 * (n - 1) * (size / n / rate + 20e-6)
    for job in run.jobs:
        assert job.switches == 2 and job.shared
        assert job.mean_iteration_s == pytest.approx(by_hand, rel=0.01)
    alone = compute_seconds("vgg16", "V100") + 2 * (n - 1) * (size / n / (2 * rate) + 20e-6)
    assert run.jobs[0].alone_iteration_s == pytest.approx(alone, rel=1e-6)


SACCT = DATA / "sacct_parsable2.txt"
PAPER_RACK = str(Path(__file__).resolve().parents[2] / "topologies" / "paper-testbed.yaml")


def test_a_sacct_dump_imports_jobs_not_steps_with_their_gres_types():
    imported = traces.load(SACCT)
    assert imported.fmt == "sacct"
    # 101: 4 M40 for 30 min; 102: 2 Titan V, failed after 20 min (it still held them); 103: scancel after
    # 5 min, any GPU; 107: a time limit after an hour, two types, so any GPU
    assert [(j.arrival_s, j.gpus, j.duration_s, j.gpu_model) for j in imported.jobs] == [
        (0, 4, 1800, "M40"), (600, 2, 1200, "TitanV"), (1200, 1, 300, ""), (3600, 6, 3600, "")]
    assert imported.left_out == {"no GPU": 1, "never started": 1, "not ended when sacct ran": 1}
    assert imported.jobs[0].source.endswith("sacct_parsable2.txt:2")


def test_simulate_replays_a_sacct_dump(tmp_path):
    out = tmp_path / "sim"
    assert cli(["simulate", "--rack", PAPER_RACK, "--trace", str(SACCT), "--trace-format", "sacct", "--out", str(out),
                "--quiet",
                "--no-plots", "--policies", "fixed,regroup", "--workers", "1"]) == 0
    workload = json.loads((out / "results.json").read_text())["workload"]
    assert workload["format"] == "sacct" and workload["jobs"] == 4


@pytest.mark.parametrize(
    "line, message",
    [
        ("108|eve|2026-11-20T10:00:00|yesterday|2026-11-20T11:00:00|COMPLETED|gres/gpu=2",
         "line 3: Start: 'yesterday'"),
        ("108|eve|2026-11-20T10:00:00|2026-11-20T10:00:00|COMPLETED|gres/gpu=2", "line 3: 6 fields, expected 7"),
        ("108|eve|2026-11-20T10:00:00|2026-11-20T10:00:00|2026-11-20T11:00:00|COMPLETED|gres/gpu=two",
         "line 3: AllocTRES: 'two' is not a whole number of GPUs"),
    ],
)
def test_a_sacct_dump_with_a_bad_line_exits_2_naming_the_line(tmp_path, capsys, line, message):
    dump = tmp_path / "sacct.txt"
    dump.write_text("\n".join(SACCT.read_text().splitlines()[:2] + [line]) + "\n")
    out = tmp_path / "sim"
    assert cli(["simulate", "--rack", PAPER_RACK, "--trace", str(dump), "--trace-format", "sacct", "--out", str(out),
                "--quiet",
                "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{dump}: {message}" in err
    assert not out.exists()


def test_a_file_that_is_not_a_sacct_dump_is_refused_by_its_header(tmp_path):
    dump = tmp_path / "sacct.txt"
    dump.write_text("JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode\n1|x|p|a|1|COMPLETED|0:0\n")
    with pytest.raises(TraceError, match="line 1: not sacct --parsable2 output: the header lacks Submit, Start, End"):
        traces.load(dump, "sacct")
