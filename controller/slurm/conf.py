"""Slurm's configuration from the rack file: each server a node, each GPU a GRES typed by its model
(`gpu:m40`), and the fabric as a tree topology (`topology.conf`) from the live circuits.

Pure text: nothing here writes a file or starts a daemon (emulation/slurm.py does, for the
emulated rack; a lab merges what it wants of it into its own files, see docs/slurm.md).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from controller.core.circuits import CircuitMap
from controller.core.rack import Rack

GPU_GRES = "gpu"
# A job step's credential lifetime, and so how long slurmctld holds a requeued batch job before it may start again
# (Slurm's default is 120 s). Lowered so that a job requeued after a lost node runs again within seconds; a step
# must still launch (prolog, environment) within it.
CRED_EXPIRE_S = 10
TOP_SWITCH = "fabric"  # topology.conf's root: every aggregator switch hangs under it


def gres_type(model: str) -> str:
    """A GPU model as a GRES type: M40 -> m40, TitanV -> titanv (Slurm matches types as written)."""
    return re.sub(r"[^a-z0-9]", "", model.lower())


@dataclass(frozen=True)
class Layout:
    """Where one Slurm of ours keeps its files, state, logs and sockets: all under `root`, so that
    taking it down removes one tree. Slurm finds gres.conf and topology.conf beside slurm.conf."""

    root: Path

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres(self) -> Path:
        return self.root / "gres.conf"

    @property
    def topology(self) -> Path:
        return self.root / "topology.conf"

    @property
    def state(self) -> Path:
        return self.root / "ctld"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket.2"

    @property
    def ctld_pid(self) -> Path:
        return self.root / "slurmctld.pid"

    def node_dir(self, server: str) -> Path:
        return self.root / "nodes" / server

    def device(self, server: str, index: int) -> Path:
        """The stand-in device file of one GPU (a character device; the emulated GPU has no driver)."""
        return self.node_dir(server) / "dev" / f"nvidia{index}"

    @property
    def dbd_conf(self) -> Path:
        return self.root / "slurmdbd.conf"

    @property
    def db(self) -> Path:
        """The accounting database's data directory (MariaDB, for slurmdbd)."""
        return self.root / "db"


def node_name(rack: Rack, server: str) -> str:
    """The Slurm node of a server: the server's own name (slurm.conf's NodeName lines are written so)."""
    if server not in rack.servers:
        raise ValueError(f"{server!r} is not a server of rack {rack.name} (its servers: {', '.join(rack.servers)})")
    return server


def node_gres(rack: Rack, server: str) -> str:
    """`gpu:m40:1,gpu:titanv:1`: a node's GPUs by type, in the order of their first index."""
    gpus = sorted(rack.servers[server].gpus, key=lambda g: g.index)
    counts = Counter(gres_type(g.model) for g in gpus)
    return ",".join(f"{GPU_GRES}:{t}:{n}" for t, n in counts.items())


def gres_conf(rack: Rack, layout: Layout | None = None) -> str:
    """One line per GPU: its node, its type and its device file, in index order, so that Slurm's
    GRES index on a node (what `scontrol show job -d` prints as IDX) is the GPU's `index`. The
    device files: the emulated GPUs' stand-ins under `layout`, else a lab's /dev/nvidiaN."""
    lines = ["# Written by optirack from the rack file " + rack.source + "; do not edit by hand.",
             "AutoDetect=off"]
    for s in rack.spec.servers:
        for g in sorted(s.gpus, key=lambda g: g.index):
            lines.append(f"NodeName={node_name(rack, s.name)} Name={GPU_GRES} Type={gres_type(g.model)} "
                         f"File={layout.device(s.name, g.index) if layout else f'/dev/nvidia{g.index}'}")
    return "\n".join(lines) + "\n"


def gpu_at(rack: Rack, server: str, gres_index: int) -> str | None:
    """The rack's GPU behind a node's GRES index (gres.conf lists them in `index` order)."""
    gpus = sorted(rack.servers[server].gpus, key=lambda g: g.index)
    return gpus[gres_index].name if 0 <= gres_index < len(gpus) else None


def slurm_conf(rack: Rack, layout: Layout, ctld_host: str, ctld_addr: str, node_addrs: dict[str, str], *,
               prolog: str | None = None, epilog: str | None = None, topology: bool = True,
               hook_timeout_s: int = 60, dbd_port: int | None = None, cred_expire_s: int = CRED_EXPIRE_S) -> str:
    """slurm.conf for a rack whose servers are the nodes (`node_addrs`: server -> address slurmctld
    reaches its slurmd at). Accounting through slurmdbd on this host at `dbd_port` (sacct shows the
    GPUs a job held, AllocTRES gres/gpu, only with slurmdbd); without it none. `cred_expire_s`: how
    long a job step's credential lives, which is also how long slurmctld holds a requeued batch job
    before it may start again (Slurm's default 120 s)."""
    cpus = 2  # what the emulated servers declare (slurmd's own count is overridden; see below)
    types = sorted({gres_type(g.model) for g in rack.gpus.values()})
    lines = [
        f"# Written by optirack from the rack file {rack.source}; do not edit by hand.",
        f"ClusterName={cluster_name(rack)}",
        f"SlurmctldHost={ctld_host}({ctld_addr})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={layout.munge_socket},cred_expire={cred_expire_s}",
        f"StateSaveLocation={layout.state}",
        f"SlurmdSpoolDir={layout.root / 'nodes' / '%n' / 'spool'}",
        f"SlurmctldPidFile={layout.ctld_pid}",
        f"SlurmdPidFile={layout.root / 'nodes' / '%n' / 'slurmd.pid'}",
        f"SlurmctldLogFile={layout.root / 'slurmctld.log'}",
        f"SlurmdLogFile={layout.root / 'nodes' / '%n' / 'slurmd.log'}",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        # Every emulated server sees the host's CPUs and memory: the counts below are taken as declared.
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SchedulerType=sched/backfill",
        # A job whose start time comes (a requeued one, once cred_expire passed) is started by the next backfill pass:
        # every 2 s here, not Slurm's 30 s, which would add up to 30 s to a requeued job's restart
        "SchedulerParameters=bf_interval=2",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # A node down for not responding comes back when its slurmd registers again; one set DOWN with a reason (by
        # the controller, for a dead server: controller/slurm/scheduler.py) only when resumed (2 would return it on
        # any message from it, even one in flight from before its death, and Slurm would place the requeued job there)
        "ReturnToService=1",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=600",
        f"GresTypes={GPU_GRES}",
        "MailProg=/bin/true",
        "JobAcctGatherType=jobacct_gather/none",
    ]
    if dbd_port:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={ctld_host}",
            f"AccountingStoragePort={dbd_port}",
            f"AccountingStoragePass={layout.munge_socket}",  # for slurmdbd: the munge socket, as AuthInfo is
            "AccountingStoreFlags=job_comment",  # sacct --format Comment: what the hooks wrote
            "AccountingStorageTRES=" + ",".join([f"gres/{GPU_GRES}"] + [f"gres/{GPU_GRES}:{t}" for t in types]),
        ]
    else:
        lines.append("AccountingStorageType=accounting_storage/none")
    if topology:
        lines.append("TopologyPlugin=topology/tree")
    if prolog:
        lines.append(f"PrologSlurmctld={prolog}")
    if epilog:
        lines.append(f"EpilogSlurmctld={epilog}")
    if prolog or epilog:
        lines.append(f"PrologEpilogTimeout={hook_timeout_s}")
    for s in rack.spec.servers:
        lines.append(f"NodeName={node_name(rack, s.name)} NodeAddr={node_addrs[s.name]} CPUs={cpus} RealMemory=1024 "
                     f"Gres={node_gres(rack, s.name)} State=UNKNOWN")
    lines.append(f"PartitionName=rack Nodes={','.join(rack.servers)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def slurmdbd_conf(layout: Layout, dbd_host: str, dbd_port: int, db_port: int, db_password: str) -> str:
    """slurmdbd.conf: slurmdbd on this host, storing in a MariaDB of its own on 127.0.0.1:`db_port`."""
    return "\n".join([
        "# Written by optirack; do not edit by hand.",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        f"DbdHost={dbd_host}",
        f"DbdPort={dbd_port}",
        "SlurmUser=root",
        f"PidFile={layout.root / 'slurmdbd.pid'}",
        f"LogFile={layout.root / 'slurmdbd.log'}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={db_port}",
        "StorageUser=slurm",
        f"StoragePass={db_password}",
        "StorageLoc=slurm_acct_db",
    ]) + "\n"


def cluster_name(rack: Rack) -> str:
    return f"optirack-{rack.name}".lower()[:40]


def leaf_of(rack: Rack, circuits: CircuitMap) -> dict[str, str | None]:
    """Server -> the aggregator switch most of its GPUs hang under now (first in the rack file on a
    tie; None if no GPU of it has a circuit). Slurm's tree has nodes, not GPUs, at its leaves."""
    where = circuits.gpu_locations(rack)
    order = {name: i for i, name in enumerate(rack.aggregators())}
    result: dict[str, str | None] = {}
    for s in rack.spec.servers:
        counts = Counter(where[g.name][0] for g in s.gpus if g.name in where and where[g.name][0] in order)
        result[s.name] = min(counts, key=lambda w: (-counts[w], order[w])) if counts else None
    return result


def topology_conf(rack: Rack, circuits: CircuitMap) -> str:
    """The fabric as Slurm's tree: one leaf switch per aggregator switch with the nodes under it,
    and one switch above them all (the uplinks), so Slurm prefers nodes that share a switch."""
    leaf = leaf_of(rack, circuits)
    lines = ["# Written by optirack from the live circuits; rewritten after each circuit change."]
    used = []
    for w in rack.aggregators():
        nodes = [s for s, where in leaf.items() if where == w]
        if nodes:
            lines.append(f"SwitchName={w} Nodes={','.join(nodes)}")
            used.append(w)
    loose = [s for s, where in leaf.items() if where is None]
    if loose:  # no circuit at all: under no leaf, Slurm would not place on them
        lines.append(f"SwitchName=unwired Nodes={','.join(loose)}")
        used.append("unwired")
    lines.append(f"SwitchName={TOP_SWITCH} Switches={','.join(used)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m controller.slurm.conf RACK nodes|gres|topology`: the lines a lab merges into its own files."""
    import argparse
    import sys

    from controller.core.rack import RackError, load_rack

    p = argparse.ArgumentParser(prog="python -m controller.slurm.conf", description=main.__doc__)
    p.add_argument("rack", help="the rack file")
    p.add_argument("what", choices=["nodes", "gres", "topology"],
                   help="nodes: NodeName lines for slurm.conf; gres: gres.conf; topology: topology.conf from the "
                   "rack file's circuits")
    args = p.parse_args(argv)
    try:
        rack = load_rack(args.rack)
    except RackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.what == "nodes":
        for s in rack.spec.servers:
            print(f"NodeName={node_name(rack, s.name)} Gres={node_gres(rack, s.name)}")
    elif args.what == "gres":
        print(gres_conf(rack), end="")
    else:
        print(topology_conf(rack, CircuitMap.initial(rack)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
