"""Which of the rack's GPUs Slurm gave a job: `scontrol show job -d` read into GPU names.

`scontrol show job -d` prints one line per group of nodes with the same allocation, e.g.
`Nodes=srv[2,4] CPU_IDs=0 Mem=0 GRES=gpu:m40:1(IDX:0)`; IDX is the GRES index on the node, which
is the GPU's `index` in the rack file because gres.conf lists them in that order (conf.gres_conf).
`read` needs nothing but the text (the PrologSlurmctld starts fast: it sends the nodes and indexes, and the controller
names the GPUs with `gpus_of`); `parse` does both.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.core.rack import Rack

_NODES = re.compile(r"^\s*Nodes=(?P<nodes>\S+)\s.*\bGRES=(?P<gres>\S*)")
_GPU_IDX = re.compile(r"gpu(?::[^:(,]+)?(?::\d+)?\(IDX:(?P<idx>[^)]*)\)")
_FIELD = re.compile(r"(?:^|\s)(?P<key>[A-Za-z_]+)=(?P<value>\S*)")


class AllocationError(ValueError):
    """What Slurm printed does not name GPUs of this rack."""


@dataclass
class Allocation:
    job: str
    user: str = ""
    state: str = ""
    comment: str = ""
    nodes: dict[str, list[int]] = field(default_factory=dict)  # node -> its GRES indexes of the job, as listed
    gpus: list[str] = field(default_factory=list)  # the rack's GPU names, by node then index (parse)


def hostnames(expr: str) -> list[str]:
    """Slurm's host list `srv[1-2,4],gpu7` as names."""
    out, depth, part = [], 0, ""
    parts = []
    for ch in expr:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    for p in filter(None, parts):
        m = re.fullmatch(r"(?P<pre>[^\[]*)\[(?P<ranges>[^\]]+)\](?P<post>.*)", p)
        if not m:
            out.append(p)
            continue
        for r in m["ranges"].split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{m['pre']}{n:0{width}d}{m['post']}")
    return out


def indexes(text: str) -> list[int]:
    """`0-1,3` as [0, 1, 3]."""
    out: list[int] = []
    for r in filter(None, text.split(",")):
        lo, _, hi = r.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def read(job: str, text: str) -> Allocation:
    """An allocation from `scontrol show job -d JOB`'s output: its nodes and their GPUs' GRES indexes."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if _NODES.match(line):
            continue
        for m in _FIELD.finditer(line):
            fields.setdefault(m["key"], m["value"])
    if fields.get("JobId") not in (None, job):
        raise AllocationError(f"scontrol printed job {fields.get('JobId')}, not {job}")
    comment = re.search(r"^\s*Comment=(.*)$", text, re.M)
    alloc = Allocation(job, fields.get("UserId", "").split("(")[0], fields.get("JobState", ""),
                       comment.group(1).strip() if comment and comment.group(1).strip() != "(null)" else "")
    for line in text.splitlines():
        nodes = _NODES.match(line)
        if not nodes:
            continue
        idx = [i for g in _GPU_IDX.finditer(nodes["gres"]) for i in indexes(g["idx"])]
        for node in hostnames(nodes["nodes"]):
            alloc.nodes.setdefault(node, []).extend(idx)
    return alloc


def gpus_of(rack: Rack, nodes: dict[str, list[int]]) -> list[str]:
    """The rack's GPUs behind Slurm's nodes and GRES indexes, by node then index as given. Raises AllocationError
    naming a node that is not a server of the rack, or an index it has no GPU at."""
    from controller.slurm.conf import gpu_at

    out = []
    for node, idx in nodes.items():
        if node not in rack.servers:
            raise AllocationError(f"node {node} is not a server of rack {rack.name}")
        for i in idx:
            name = gpu_at(rack, node, i)
            if name is None:
                raise AllocationError(f"node {node} has no GPU of GRES index {i} in rack {rack.name}")
            out.append(name)
    return out


def parse(rack: Rack, job: str, text: str) -> Allocation:
    """`read`, and the rack's GPU names."""
    alloc = read(job, text)
    alloc.gpus = gpus_of(rack, alloc.nodes)
    return alloc
