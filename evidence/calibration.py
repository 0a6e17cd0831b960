"""Where the simulator's calibration constants (simulator/model/calibration.py) were measured: the benchmark records
each
comes from. tests/unit/test_step_cost.py and tests/unit/test_sim_fidelity.py tie each constant to its records, and
`make report` tabulates them (evidence/report/bench.py).

STEP_S, what a ring step costs beyond its bytes at the line rate on the emulated fabric: the median over 100
all-reduces of `python scripts/bench_allreduce.py --mbytes 0.528 --iterations 100` (a ring of 4 under one switch, the
paper cases' 528 kB gradient at the default rack's scale and dilation, no compute), STEP_RECORD (9.70 ms, 4.0-14.3).
A tiny all-reduce pays 0.72 ms per step on the same fabric (...-bench_allreduce-tiny.json) and 3-4 ms on loopback
(scripts/bench_loopback.py).

SMALL_STEP_S and SMALL_CHUNK_BYTES (measured on the trace rack after its replay showed ResNet-50's rings iterating
0.83 of the simulator's time): the same benchmark at the chunks the trace rack's jobs send (`--topo
topologies/trace16.yaml`, 25 Mbit/s, and the default rack at 50 Mbit/s; rings of 2 and 4, 60 all-reduces each).
Per step beyond the bytes at the line rate, medians: chunks of 1-25.6 kB (emulated) 0.10-0.72 ms at either rate
(SMALL_STEP_RECORDS), chunks of 34.6-138 kB 3.6-13.9 ms (LARGE_STEP_RECORDS, STEP_S's 9.70 among them): a step up
between 25.6 kB and 34.6 kB that is a matter of bytes, not of the rate (25.6 kB costs 0.10 ms at 25 Mbit/s, where it
takes as long on the wire as 51 kB at 50 Mbit/s, which costs 7.4 ms at 46 kB). Above it the cost shows no trend with
the chunk (noisy: each record's min-max spans 2-30 ms). Where the step lies between the two sizes measured is not
known: the threshold is the largest chunk measured cheap; SMALL_STEP_S is the median of the five small records.
"""
from __future__ import annotations

STEP_RECORD = "results/bench/20261125T113203Z-fe45bd6-bench_allreduce-vgg16-chunk.json"
SMALL_STEP_RECORDS = (
    "results/bench/20261125T113234Z-fe45bd6-bench_allreduce-tiny.json",
    "results/bench/20261126T171325Z-730bb1c-bench_allreduce-trace16-resnet50-n4.json",
    "results/bench/20261126T171404Z-730bb1c-bench_allreduce-trace16-resnet50-n2.json",
    "results/bench/20261126T171420Z-730bb1c-bench_allreduce-trace16-tiny-n4.json",
    "results/bench/20261126T171742Z-024dfcf-bench_allreduce-paper-chunk26k-n4.json",
)
LARGE_STEP_RECORDS = (
    STEP_RECORD,
    "results/bench/20261126T171300Z-730bb1c-bench_allreduce-trace16-vgg16-n4.json",
    "results/bench/20261126T171342Z-730bb1c-bench_allreduce-trace16-vgg16-n2.json",
    "results/bench/20261126T171632Z-024dfcf-bench_allreduce-trace16-chunk35k-n4.json",
    "results/bench/20261126T171655Z-024dfcf-bench_allreduce-trace16-chunk46k-n4.json",
    "results/bench/20261126T171726Z-024dfcf-bench_allreduce-trace16-chunk92k-n2.json",
    "results/bench/20261126T171800Z-024dfcf-bench_allreduce-paper-chunk69k-n4.json",
    "results/bench/20261126T171820Z-024dfcf-bench_allreduce-paper-chunk46k-n4.json",
)
