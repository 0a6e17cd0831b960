"""The flags of `optirack simulate` (simulator/cli/main.py runs them): the rack, the workload, the network, the failure
model and the output, each with its help, and the --help's examples.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from controller import bundled
from simulator.cli import report
from simulator.inputs import traces
from simulator.inputs.workloads import DURATION_MODES
from simulator.model import failures, neighbours
from simulator.model.network import SHARINGS

PAPER_RACK = "topologies/paper-testbed.yaml"
EXAMPLES = (  # the --help's examples, each as it runs from any directory (tests/unit/test_sim_help.py runs the first)
    "optirack simulate --rack paper-testbed --case a --out sim-a",
    "optirack simulate --gpus 4096 --jobs 2000 --seed 7 --out sim-4096",
    "optirack simulate --gpus 32 --gpus-per-switch 8 --gpus-per-server 4 --oversubscription 8 --spare 1 --models V100 "
    "--trace sample.csv --out sim-trace",
)


def build(sub) -> argparse.ArgumentParser:
    """Add the `simulate` subcommand with every flag to `sub`; the parser (simulator/cli/main.py sets its main)."""
    p = sub.add_parser(
        "simulate", help="simulate a cluster under the controller's placement policies",
        description="Simulate training jobs on a rack (a rack file or a generated one) under each placement policy, "
                    "with the controller's own placement code, and write a table, JSON and plots to --out.",
        epilog="Examples: " + ";  ".join(EXAMPLES) + ". Rack files and traces are found by name from any "
               "directory (the bundled ones, or a path to your own).")
    _rack_flags(p)
    _workload_flags(p)
    _policy_flags(p)
    _failure_flags(p)
    neighbours.add_arguments(p)
    _output_flags(p)
    return p


def _rack_flags(p) -> None:
    """The rack: a rack file, or a generated one and its shape."""
    rack = p.add_argument_group("rack (one of)")
    rack.add_argument("--rack", help="a rack file, or a bundled one by name, e.g. paper-testbed (default with --case: "
                      f"{PAPER_RACK})")
    rack.add_argument("--gpus", type=int, help="generate a rack of this many GPUs")
    rack.add_argument(
        "--gpus-per-switch", type=int, default=32, help="generated: GPUs per aggregator switch (%(default)s)"
    )
    rack.add_argument("--gpus-per-server", type=int, default=8, help="generated: GPUs per server (%(default)s)")
    rack.add_argument(
        "--oversubscription",
        type=float,
        default=16.0,
        help="generated: a switch's GPUs' NIC capacity over its uplink's (%(default)s: 32 x 100 Gbit/s "
        "over 200 Gbit/s)",
    )
    rack.add_argument(
        "--spare",
        type=float,
        default=2.0,
        help="generated: a switch's OCS downlinks over its share of the GPUs, the room regrouping "
        "moves GPUs into (%(default)s)",
    )
    rack.add_argument(
        "--models",
        default="V100:0.5,A100:0.5",
        help="generated: GPU models and their shares of the servers (%(default)s)",
    )
    rack.add_argument(
        "--ocs-ports",
        type=int,
        default=0,
        help="generated: at most this many ports per OCS (default: 1024, or up to 9999 when every switch's "
        "ports on every OCS need more)",
    )
    rack.add_argument("--nic-gbps", type=float, default=100.0, help="generated: NIC line rate (%(default)s)")


def _workload_flags(p) -> None:
    """The workload: the paper's case, a trace, or synthetic jobs."""
    work = p.add_argument_group("workload (one of)")
    work.add_argument("--case", choices=["a", "b"], help="the paper's case, as make demo runs it")
    work.add_argument(
        "--trace",
        help="a trace file: CSV (arrival_s,gpus,model and iterations or duration_s; optional gpu_type), or a "
        "public trace (see --trace-format); a bundled one by name, e.g. sample.csv",
    )
    work.add_argument(
        "--trace-format",
        choices=["auto", *traces.FORMATS, traces.LINGJUN],
        default="auto",
        help="philly: msr-fiddle/philly-traces' cluster_job_log (JSON); helios: HeliosData's or Acme's "
        "cluster_log.csv; pai: Alibaba PAI 2020's pai_task_table.csv (pai_job_table.csv beside it gives "
        "submit times); sacct: Slurm's sacct --parsable2 with JobID,Submit,Start,End,AllocTRES; "
        "auto: by the file's name and first line (%(default)s)",
    )
    work.add_argument(
        "--trace-model",
        default="resnet50",
        help="the workload every job of a public trace runs, which names none: vgg16, resnet50 or "
        "transformer:<parameters>, e.g. transformer:7e9 (%(default)s)",
    )
    work.add_argument(
        "--durations",
        choices=list(DURATION_MODES),
        default="derived",
        help="jobs given by duration: derived: iterations from the workload, so that alone on the fabric a job "
        "keeps its recorded duration; replayed: held for the recorded duration as is, off the network (%(default)s)",
    )
    work.add_argument(
        "--strict",
        action="store_true",
        help="refuse a trace with a job larger than the rack (default: skip such jobs and count them)",
    )
    work.add_argument("--jobs", type=int, help="this many synthetic jobs (see --seed, --load)")
    work.add_argument("--seed", type=int, default=1, help="synthetic jobs: random seed (%(default)s)")
    work.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="synthetic jobs: run this many seeds (--seed, --seed+1, ...) and give means with 95 %% intervals "
        "(%(default)s)",
    )
    work.add_argument(
        "--load",
        type=float,
        default=0.9,
        help="synthetic jobs: offered load, in GPU-seconds over the cluster's (%(default)s)",
    )
    work.add_argument(
        "--iterations", type=int,
        help="--case: iterations of the job of concern (default: as the demo ran them, the compared record's)"
    )


def _policy_flags(p) -> None:
    """The policies compared, their schedulers and baseline, and the network's model."""
    pol = p.add_argument_group("policies and models")
    pol.add_argument(
        "--policies",
        default="fixed,regroup,defrag,timeshift",
        help="which to compare (%(default)s); baselines: ideal (a non-blocking electrical fabric, the upper "
        "bound), static (the static oversubscribed electrical fabric: the cabling never changes, as fixed); the "
        "neighbours (docs/neighbour-*.md): oddl, panama, switchml, topoopt, sipml, mltcp",
    )
    pol.add_argument(
        "--schedulers",
        default="fifo",
        help="admission policies (controller/core/admission.py), each run with every placement policy: fifo (first "
        "come first served), backfill (EASY backfill), sjf (shortest job first), las (least attained service, "
        "preemptive, Tiresias-like); a run other than fifo is named policy+scheduler, e.g. regroup+backfill "
        "(%(default)s)",
    )
    pol.add_argument(
        "--baseline",
        help="the policy the others are compared with, in percent (default: the first of --policies)",
    )
    pol.add_argument(
        "--defrag-interval", type=float, default=300.0, help="defrag: seconds between rounds (%(default)s)"
    )
    pol.add_argument(
        "--net",
        choices=["rack", "emulation"],
        help="rack: a real rack's protocol efficiency and step latency (assumed), max-min sharing; "
        "emulation: calibrated to this project's emulated rack from a demo record (--calibration), with the "
        "sharing of that record's fabric: max-min on the lossless fabric (the default), held on droptail "
        "(default: emulation with --case, rack otherwise)",
    )
    pol.add_argument(
        "--sharing",
        choices=list(SHARINGS),
        help="how rings placed on one link share it, overriding --net's: maxmin: the rings transferring "
        "at the moment share it max-min fairly and a computing ring's share goes to the others at "
        "once (a lossless fabric: RoCE with PFC, and the emulated lossless fabric; --net rack's, and --net "
        "emulation's on a lossless record); held: each ring keeps its equal share through its compute phases "
        "(the emulated droptail fabric's TCP over shallow drop-tail queues; --net emulation's on a droptail "
        "record). Time shifting only shifts under maxmin",
    )
    pol.add_argument(
        "--nvlink-gbps",
        type=float,
        default=0.0,
        help="a server's GPUs as an NVLink domain at this rate per GPU, e.g. 2400 (300 GB/s): flows inside a "
        "server skip the NICs, transformers' tensor parallelism runs over it (default 0: every flow through "
        "its NIC, as in the emulation)",
    )
    pol.add_argument("--efficiency", type=float,
                     help="override the protocol efficiency, a fraction of line rate in (0, 1], e.g. 0.9")
    pol.add_argument("--step-latency-us", type=float,
                     help="override the per-step latency (rack microseconds, 0 or more)")
    pol.add_argument(
        "--calibration",
        help="--net emulation: the make demo record to calibrate from and, with --case, compare with (a file, or a "
        f"record's name under {bundled.RECORDS}/; default: the newest committed whole record of the rack's fabric)",
    )
    pol.add_argument(
        "--step-model",
        choices=["auto", "exact", "phase"],
        default="auto",
        help="exact: every ring step an event; phase: whole all-reduces (auto: exact up to 64 GPUs)",
    )
    pol.add_argument(
        "--interference",
        choices=["auto", "detail", "mean"],
        default="auto",
        help="rings that share links: stepped through (detail) or the mean-field model (auto: by size)",
    )
    pol.add_argument(
        "--control-overhead-ms",
        type=float,
        default=10.0,
        help="controller time per reconfiguration besides switching (%(default)s; make bench measures it)",
    )


def _failure_flags(p) -> None:
    """Server failures and how jobs recover from them."""
    fail = p.add_argument_group("server failures (simulator/model/failures.py)")
    fail.add_argument(
        "--failures",
        default="none",
        help="recoveries to compare, each run with every policy and scheduler: none (no failures), swap (spare GPUs "
        "swapped in through the OCS, restart from the last checkpoint), checkpoint (restart from the last "
        "checkpoint after the server's repair), scratch (restart from the first iteration); a run with failures is "
        "named policy+recovery, e.g. regroup+swap (%(default)s)",
    )
    fail.add_argument(
        "--server-mtbf-h",
        type=float,
        default=failures.MTBF_H,
        help="mean hours between one server's failures (%(default).1f: Llama 3's 419 interruptions in 54 days on "
        "2,048 servers of 8 GPUs)",
    )
    fail.add_argument("--repair-h", type=float, default=failures.REPAIR_H,
                      help="hours a failed server is out (%(default)s; assumed)")
    fail.add_argument("--swap-s", type=float, default=failures.SWAP_S,
                      help="swap: seconds from the failure to the job iterating again (%(default)s: the failover "
                      "benchmark's measured median, a server killed, survivors kept, a warm spare; "
                      "scripts/bench_failover.py --rounds 20)")
    fail.add_argument("--restart-s", type=float, default=failures.RESTART_S,
                      help="checkpoint, scratch: seconds from being placed again to iterating (%(default)s; assumed)")
    fail.add_argument("--checkpoint-s", type=float, default=failures.CHECKPOINT_S,
                      help="seconds of running between a job's checkpoints (%(default)s; assumed)")


def _output_flags(p) -> None:
    """Where the results go, and how much of them."""
    out = p.add_argument_group("output")
    out.add_argument(
        "--out", type=Path, required=True, help="folder for summary.md, results.json, jobs.csv (see --detail) and plots"
    )
    out.add_argument(
        "--detail",
        action="store_true",
        help=f"runs of more than {report.DETAIL_LIMIT:,} jobs: also write every job's row, gzipped (jobs.csv.gz); "
        "smaller runs always keep them (jobs.csv, results.json)",
    )
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument(
        "--workers",
        type=int,
        default=0,
        help="processes to run the policies in (default: one per core, at most one per policy)",
    )


# Each number flag of the failure model with its unit and the values it takes: refused in the unit it is given in
# (simulator.model.failures.Failures.check would name the seconds it converts the hours to).
FAILURE_FLAGS = (("server_mtbf_h", "hours", False), ("repair_h", "hours", True), ("swap_s", "seconds", True),
                 ("restart_s", "seconds", True), ("checkpoint_s", "seconds", False))


def check_failure_flags(args) -> None:
    """A ValueError naming the flag, its unit and what it must be, for a failure setting out of range."""
    for name, unit, zero in FAILURE_FLAGS:
        value = getattr(args, name)
        if not (0 <= value if zero else 0 < value) or value == float("inf") or value != value:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is in {unit} and must be {'0 or more' if zero else 'positive'}, not {value:g}")
