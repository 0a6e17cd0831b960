"""The controller's own options, registered with Ryu's oslo.config as ``--optirack-*`` (section [optirack])."""
from __future__ import annotations

import os
from pathlib import Path

from ryu import cfg

from controller.bundled import DEFAULT_RACK
from controller.core.emulated import RUN_DIR
from controller.drivers import registry

REPO = Path(__file__).resolve().parent.parent

OPTS = [
    cfg.StrOpt("rack", default=str(DEFAULT_RACK), help="rack file (YAML) the controller manages"),
    cfg.StrOpt("state-dir", default="/var/lib/optirack", help="where the job table, circuits and token are kept"),
    cfg.StrOpt(
        "token-file", default=None, help="bearer token for REST mutations (default: STATE_DIR/token, made if missing)"
    ),
    cfg.FloatOpt("monitor-interval", default=1.0, help="seconds between port statistics polls"),
    cfg.IntOpt("monitor-history", default=600, help="throughput samples kept per port"),
    cfg.FloatOpt("barrier-timeout", default=10.0, help="seconds to wait for a switch to confirm changes"),
    cfg.FloatOpt(
        "device-probe-interval",
        default=5.0,
        help="seconds between probes of an OCS that does not connect to the controller (TL1)",
    ),
    cfg.FloatOpt(
        "device-retry-max",
        default=30.0,
        help="longest wait between tries to reach a lost OCS (the wait doubles from 0.5 s up to this)",
    ),
    cfg.StrOpt(
        "nic-home",
        default="emulated",
        choices=["emulated", "host"],
        help="where GPU NICs live outside containers: the emulated rack's server namespaces, or a real host's",
    ),
    cfg.FloatOpt(
        "engine-poll",
        default=2.0,
        help="seconds between health checks of the servers' Docker Engines (one that comes back has its "
        "stale containers removed)",
    ),
    cfg.BoolOpt(
        "fault-hold-configuring",
        default=False,
        help="for tests of reconciliation only: the job service takes a job no further once its circuits and "
        "containers are in place, its state left 'configuring', as if the controller died there",
    ),
    cfg.BoolOpt(
        "fault-hold-confirm",
        default=False,
        help="for tests of an OCS's own rollback only: every change of circuits stops once each OCS has taken it and "
        "read it back, before it is confirmed, as if the controller died there (a NETCONF OCS then undoes it)",
    ),
    cfg.StrOpt(
        "fault-hold-recovering",
        default=None,
        choices=["detected", "assessed", "swapped", "told", "restarting"],
        help="for tests of recovery only: a recovering job's recovery stops once this step is recorded, its state "
        "left 'recovering', as if the controller died there",
    ),
    cfg.StrOpt(
        "queue",
        default="fifo",
        choices=["fifo", "backfill", "sjf"],
        help="the queue's discipline (controller/core/admission.py, as the simulator's): fifo, first come first "
        "served; backfill, EASY backfilling; sjf, shortest estimated job first. backfill and sjf need each job's "
        "estimate_s. las, which preempts, is the simulator's only",
    ),
    cfg.StrOpt(
        "slurm-conf",
        default=str(RUN_DIR / "slurm" / "slurm.conf"),
        help="slurm.conf of the Slurm that schedules the rack (default: the emulated rack's): the controller tells it "
        "of dead servers under its jobs and keeps topology.conf beside it to the live circuits when it names "
        "TopologyPlugin=topology/tree (docs/slurm.md); 'none' leaves Slurm alone",
    ),
    cfg.StrOpt(
        "worker-image",
        default=f"optirack-worker:{os.environ.get('OPTIRACK_IMAGE_TAG', 'latest')}",
        help="Docker image of the GPU worker (on a rack with a registry: its name there, resolved to a digest "
        "at each job's start)",
    ),
]


def _driver_option(driver: str, setting: registry.Setting):
    """An OCS driver's setting (declared by the driver, controller/drivers/registry.py) as --optirack-DRIVER-NAME."""
    kind = cfg.FloatOpt if isinstance(setting.default, float) else cfg.StrOpt
    return kind(f"{driver}-{setting.name}", default=setting.default, secret=setting.secret, help=setting.help)


OPTS += [_driver_option(driver, s) for driver, s in registry.settings()]
cfg.CONF.register_cli_opts(OPTS, group="optirack")
# Listed for --help only: controller.launch turns --bind into Ryu's --wsapi-host before parsing.
cfg.CONF.register_cli_opt(
    cfg.StrOpt(
        "bind",
        metavar="ADDR",
        help="address the REST API, the live page (/) and "
        "/metrics listen on (default 127.0.0.1; 0.0.0.0 for every interface); the same as "
        "--wsapi-host. Reads need no token, changes still do",
    )
)


def conf():
    """The [optirack] option group."""
    return cfg.CONF.optirack
