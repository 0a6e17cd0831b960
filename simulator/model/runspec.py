"""What a simulated run is asked to do: its policy (placement, defragmentation, time shifting, admission, recovery)
and its options (the network, the solver's limits, the step model, failures, the emulation's lags)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from controller.core import admission
from controller.core.rack import Rack
from simulator.model.failures import RECOVERIES, Failures
from simulator.model.interference import Limits
from simulator.model.lags import NONE as NO_LAGS
from simulator.model.lags import Lags
from simulator.model.network import NetParams


@dataclass(frozen=True)
class Policy:
    name: str
    placement: str  # the controller's policy at admission: fixed | regroup
    defrag_s: float = 0.0  # defragment every this many seconds (0: never)
    timeshift: bool = False
    label: str = ""
    ideal: bool = False  # a non-blocking electrical fabric: only the NICs limit a ring (the upper bound)
    scheduler: str = "fifo"  # the admission policy of controller.core.admission
    recovery: str = ""  # with failures (Options.failures): swap | checkpoint | scratch; "" none


def with_scheduler(policy: Policy, scheduler: str) -> Policy:
    """The placement policy under another admission policy, named policy+scheduler (fifo keeps the plain name)."""
    if scheduler == "fifo":
        return policy
    if scheduler not in admission.POLICIES:
        raise ValueError(f"unknown scheduler {scheduler!r} (known: {', '.join(admission.POLICIES)})")
    return replace(policy, name=f"{policy.name}+{scheduler}", scheduler=scheduler,
                   label=f"{policy.label}; {SCHEDULER_LABELS[scheduler]}")


def with_recovery(policy: Policy, recovery: str) -> Policy:
    """The policy with server failures and this recovery (simulator/model/failures.py), named policy+recovery."""
    if recovery == "none":
        return policy
    if recovery not in RECOVERIES:
        raise ValueError(f"unknown recovery {recovery!r} (known: none, {', '.join(RECOVERIES)})")
    return replace(policy, name=f"{policy.name}+{recovery}", recovery=recovery,
                   label=f"{policy.label}; failures, {RECOVERIES[recovery]}")


SCHEDULER_LABELS = {
    "fifo": "first come first served",
    "backfill": "EASY backfill",
    "sjf": "shortest job first",
    "las": "least attained service, preemptive",
}


def policies(defrag_s: float) -> dict[str, Policy]:
    return {p.name: p for p in (
        Policy("fixed", "fixed", label="fixed: today's cabling"),
        Policy("regroup", "regroup", label="regroup at admission"),
        Policy("defrag", "regroup", defrag_s=defrag_s, label=f"regroup + defragment every {defrag_s:g} s"),
        Policy("timeshift", "regroup", timeshift=True, label="regroup + time shifting of rings that share"),
        Policy("ideal", "fixed", label="ideal non-blocking fabric (upper bound)", ideal=True),
        Policy("static", "fixed", label="static oversubscribed fabric (no OCS; as fixed)"),
    )}


@dataclass(frozen=True)
class Options:
    net: NetParams = NetParams()
    limits: Limits = Limits()
    control_overhead_s: float = 0.010  # controller work per reconfiguration besides switching
    force: str | None = None  # 'detail' or 'mean' for every shared component
    step_model: str = "auto"  # exact: every ring step an event; phase: whole all-reduces; auto: exact up to 64 GPUs
    nvlink_gbps: float = 0.0  # a server's GPUs as an NVLink domain at this rate per GPU (0: through their NICs)
    durations: str = "derived"  # jobs given by duration: "derived" iterations or "replayed" as is (workloads.py)
    failures: Failures | None = None  # server failures and how jobs recover (simulator/model/failures.py); None: none
    lags: Lags = NO_LAGS  # the emulation's container start and end, GPU release and per-iteration lags (lags.py)
    jitter: tuple[tuple[float, float], ...] | None = None  # per job (trace order): its containers' and start lags'
    # factors, one draw of the emulation's spread around them (lags.draws); None: each lag as charged

    def coarse(self, rack: Rack) -> bool:
        return self.step_model == "phase" or (self.step_model == "auto" and len(rack.gpus) > 64)
