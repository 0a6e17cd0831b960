"""Test doubles: an in-memory OpenFlow 1.3 switch that applies the messages the apps send.

`FakeSwitch` takes Ryu messages (encoding each, so a malformed one fails) and raw OpenFlow
bytes (decoding each with Ryu's parser), keeps ONF bundles until they are committed, applies
flow-mods to a flow table, answers barriers and statistics requests through the apps' own
registered handlers, and can say which port a packet would leave by.
"""
from __future__ import annotations

import inspect
import struct

from ryu.controller import ofp_event
from ryu.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser


def deliver(apps, ev) -> None:
    """Call every handler the apps registered (with @set_ev_cls) for this event's class."""
    for app in apps:
        for _, method in inspect.getmembers(app, inspect.ismethod):
            if type(ev) in getattr(method, "callers", {}):
                method(ev)


def state_change(apps, dp, state) -> None:
    ev = ofp_event.EventOFPStateChange(dp)
    ev.state = state
    deliver(apps, ev)


class FakeSwitch:
    ofproto = ofp
    ofproto_parser = parser

    def __init__(self, dpid: int, apps=(), ports=(), refuse_flow_mods: bool = False, silent: bool = False,
                 bundles: bool = True, rt=None):
        self.id = dpid
        self.rt = rt  # whose threads deliver the replies: a virtual runtime's, else the hub's
        self.bundles = bundles  # False: refuse the bundle extension, as a switch without it would
        self.open_bundles: dict[int, list] = {}
        self.committed_bundles = 0
        self.apps = list(apps)
        self.xid = 0
        self.flows: dict[tuple, tuple[int, int | None]] = {}  # (priority, match items) -> (cookie, out port)
        self.sent: list = []
        self.connected = True
        self.refuse_flow_mods, self.silent = refuse_flow_mods, silent
        self.counters = {p: [0, 0] for p in ports}  # port -> [rx_bytes, tx_bytes]

    # --- what Ryu's Datapath offers ----------------------------------------------------
    def set_xid(self, msg):
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg):
        if not self.connected:
            return False
        msg.serialize()  # must encode as OpenFlow 1.3
        self.sent.append(msg)
        self._handle(msg)
        return True

    def send(self, buf: bytes) -> bool:
        """Raw OpenFlow bytes, as Ryu's Datapath.send takes them: one or several messages."""
        if not self.connected:
            return False
        offset = 0
        while offset < len(buf):
            _, msg_type, length, xid = struct.unpack_from("!BBHI", buf, offset)
            self._raw(msg_type, xid, bytes(buf[offset:offset + length]))
            offset += length
        return True

    def _decode(self, data: bytes):
        version, msg_type, length, xid = struct.unpack_from("!BBHI", data)
        if msg_type == ofp.OFPT_FLOW_MOD:
            return parser.OFPFlowMod.parser(self, version, msg_type, length, xid, data)
        if msg_type == ofp.OFPT_BARRIER_REQUEST:
            msg = parser.OFPBarrierRequest(self)
            msg.xid = xid
            return msg
        raise AssertionError(f"the fake does not decode OpenFlow message type {msg_type}")

    def _raw(self, msg_type: int, xid: int, data: bytes) -> None:
        if msg_type != ofp.OFPT_EXPERIMENTER:
            msg = self._decode(data)
            self.sent.append(msg)
            self._handle(msg)
            return
        experimenter, exp_type, bundle_id, ctrl, _ = struct.unpack_from("!IIIHH", data, 8)
        if not self.bundles or experimenter != 0x4F4E4600:
            self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_EXPERIMENTER)
        elif exp_type == ofp.ONF_ET_BUNDLE_ADD_MESSAGE:
            inner = self._decode(data[24:])
            assert inner.xid == xid, "a bundled message carries its bundle message's xid"
            if self.refuse_flow_mods:
                self._error(xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)
            else:
                self.sent.append(inner)
                self.open_bundles[bundle_id].append(inner)
        elif ctrl == ofp.ONF_BCT_OPEN_REQUEST:
            self.open_bundles[bundle_id] = []
        elif ctrl == ofp.ONF_BCT_COMMIT_REQUEST:
            for msg in self.open_bundles.pop(bundle_id):
                self._flow_mod(msg)
            self.committed_bundles += 1
        elif ctrl == ofp.ONF_BCT_DISCARD_REQUEST:
            self.open_bundles.pop(bundle_id, None)

    def _error(self, xid: int, type_: int, code: int) -> None:
        err = parser.OFPErrorMsg(self, type_=type_, code=code)
        err.xid = xid
        self._reply(err)

    # --- behaviour ---------------------------------------------------------------------
    def connect(self) -> None:
        self.connected = True
        state_change(self.apps, self, MAIN_DISPATCHER)

    def disconnect(self) -> None:
        self.connected = False
        state_change(self.apps, self, DEAD_DISPATCHER)

    def _reply(self, msg) -> None:
        if not self.silent:
            (self.rt.spawn if self.rt else hub.spawn)(deliver, self.apps, ofp_event.ofp_msg_to_ev(msg))

    def _handle(self, msg) -> None:
        if isinstance(msg, parser.OFPFlowMod):
            if self.refuse_flow_mods:
                self._error(msg.xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)
                return
            self._flow_mod(msg)
        elif isinstance(msg, parser.OFPBarrierRequest):
            reply = parser.OFPBarrierReply(self)
            reply.xid = msg.xid
            self._reply(reply)
        elif isinstance(msg, parser.OFPFlowStatsRequest):
            body = [parser.OFPFlowStats(table_id=0, duration_sec=0, duration_nsec=0, priority=prio, idle_timeout=0,
                                        hard_timeout=0, flags=0, cookie=cookie, packet_count=0, byte_count=0,
                                        match=parser.OFPMatch(**dict(match)), instructions=self._instructions(out))
                    for (prio, match), (cookie, out) in self.flows.items()
                    if (cookie & msg.cookie_mask) == (msg.cookie & msg.cookie_mask)]
            reply = parser.OFPFlowStatsReply(self, body=body, flags=0)
            reply.xid = msg.xid
            self._reply(reply)
        elif isinstance(msg, parser.OFPPortStatsRequest):
            body = [parser.OFPPortStats(port_no=p, rx_packets=0, tx_packets=0, rx_bytes=rx, tx_bytes=tx, rx_dropped=0,
                                        tx_dropped=0, rx_errors=0, tx_errors=0, rx_frame_err=0, rx_over_err=0,
                                        rx_crc_err=0, collisions=0, duration_sec=0, duration_nsec=0)
                    for p, (rx, tx) in sorted(self.counters.items())]
            reply = parser.OFPPortStatsReply(self, body=body, flags=0)
            reply.xid = msg.xid
            self._reply(reply)

    @staticmethod
    def _instructions(out):
        if out is None:
            return []
        return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(out)])]

    def _flow_mod(self, msg) -> None:
        match = tuple(sorted(msg.match.items()))
        outs = [a.port for i in msg.instructions for a in i.actions]
        if msg.command == ofp.OFPFC_ADD:
            self.flows[(msg.priority, match)] = (msg.cookie, outs[0] if outs else None)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            self.flows.pop((msg.priority, match), None)
        elif msg.command == ofp.OFPFC_DELETE and not match and msg.table_id == ofp.OFPTT_ALL:
            self.flows.clear()
        else:
            raise AssertionError(f"the fake does not model flow-mod command {msg.command}")

    def output(self, **packet) -> int | None:
        """The port a packet with these header fields leaves by (highest priority match), or None (drop)."""
        best = None
        for (prio, match), (_, out) in self.flows.items():
            if all(packet.get(k) == v for k, v in match) and (best is None or prio > best[0]):
                best = (prio, out)
        return None if best is None else best[1]

    def circuits(self) -> set[tuple[int, int]]:
        pairs = {(dict(m)["in_port"], out) for (_, m), (_, out) in self.flows.items() if "in_port" in dict(m)}
        return {(min(a, b), max(a, b)) for a, b in pairs if (b, a) in pairs}


def wait_until(predicate, timeout: float = 5.0, what: str = "a condition"):
    """Let green threads run until `predicate()` holds."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        hub.sleep(0.005)


class FakeContainer:
    def __init__(self, name, lines, code, block=False, stderr=(), sleep=None, labels=None):
        self.name, self.lines, self.code, self.block = name, lines, code, block
        self.sleep = sleep or hub.sleep  # a virtual runtime's, or the hub's
        self.stderr = list(stderr)
        self.killed, self.removed, self.vanished = False, False, False
        self.labels = dict(labels or {})
        self.pace = 0.0

    def _follow(self, data):
        for chunk in data:
            if self.pace:  # one line per `pace` seconds (a worker that trains on the runtime's clock)
                self.sleep(self.pace)
                if self.killed:
                    return
            if self.vanished:
                raise ConnectionError("connection reset by peer")
            yield chunk
        while self.block and not self.killed:  # a worker that runs until it is killed
            self.sleep(0.01)
            if self.vanished:
                raise ConnectionError("connection reset by peer")

    def logs(self, stream=False, follow=False, stdout=True, stderr=True, tail="all", **_):
        data = [(line + "\n").encode() for line in self.lines]
        if stream:
            return self._follow(data)
        data += [(line + "\n").encode() for line in self.stderr] if stderr else []
        return b"".join(data if tail == "all" else data[-tail:])

    def wait(self, **_):
        while self.block and not self.killed and not self.vanished:
            self.sleep(0.01)
        if self.vanished:
            raise ConnectionError("connection reset by peer")
        return {"StatusCode": self.kill_code if self.killed else self.code}

    kill_code = 137

    def kill(self):
        self.killed = True


def _arg(command, flag, default=None):
    return command[command.index(flag) + 1] if flag in command else default

class FakeEngines:
    """Every engine answers unless a test marks its server down."""

    def __init__(self):
        self.down: dict[str, str] = {}
        self.back: set[str] = set()  # down servers answering again (shown down until swept)
        self._returning: set[str] = set()

    def ping(self, server):
        from controller.drivers.engines import RETURNING
        if server in self.down and server in self.back:
            self.down[server] = RETURNING
            self._returning.add(server)
        return server not in self.down

    def mark_down(self, server, why):
        self.down[server] = why

    def returning(self):
        return sorted(self._returning)

    def mark_up(self, server):
        self.down.pop(server, None)
        self._returning.discard(server)
        self.back.discard(server)


class FakeDriver:
    """A container driver that runs no containers: each 'worker' replays scripted JSON lines.

    `faults`: {"client": exception} makes every engine call raise it (an engine that cannot be
    reached); {"start": exception or {gpu: exception}} makes starting (that GPU's) container raise.
    `stderr`: gpu -> lines its worker writes to stderr. `sleep`: how a blocked worker waits (default the hub's; a
    virtual runtime's in tests on virtual time)."""

    image = "optirack-worker:latest"

    def __init__(self, iterations=3, fail_start_on=None, exit_codes=None, block=False, faults=None, stderr=None,
                 sleep=None, pace=0.0):
        self.sleep = sleep
        self.pace = pace  # > 0: workers train as the command says (iterations, checkpoints, resume), one per `pace` s
        self.iterations, self.fail_start_on, self.exit_codes = iterations, fail_start_on, exit_codes or {}
        self.block = block
        self.faults = faults or {}
        self.stderr = stderr or {}
        self.running: dict[str, FakeContainer] = {}
        self.started, self.removed, self.volumes_removed = [], [], []
        self.engines = FakeEngines()

    def _engine(self, server):
        if "client" in self.faults:
            raise self.faults["client"]

    def check_engines(self, servers):
        from controller.drivers.engines import EngineDown
        for s in sorted(servers):
            self._engine(s)
            if s in self.engines.down:
                raise EngineDown(s, f"tcp://{s}:2376", self.engines.down[s])

    def down_servers(self):
        return dict(self.engines.down)

    def worker_image(self, server):
        self._engine(server)
        return "registry:5000/optirack-worker@sha256:" + "0" * 64

    def start(self, spec, image=None, reuse=False):
        import json

        from controller.drivers.containers import ContainerError, container_name
        self._engine(spec.server)
        fault = self.faults.get("start")
        if isinstance(fault, dict):
            fault = fault.get(spec.gpu)
        if fault is not None:
            raise fault
        if spec.gpu == self.fail_start_on:
            raise ContainerError(f"cannot start the container of {spec.gpu}: no such image")
        if self.pace:
            lines = self._training(spec)
        else:
            lines = [json.dumps({"event": "iteration", "iteration": i, "t_start": 10.0 + i, "t_end": 11.0 + i,
                                 "compute_s": 0.6, "comm_s": 0.4, "iter_s": 1.0, "gpu_util": 0.6, "bytes": 1})
                     for i in range(self.iterations)]
            lines.append(json.dumps({"event": "done", "check": "ok"}))
        name = container_name(spec.job, spec.gpu)
        labels = {"job": spec.job, "gpu": spec.gpu, "server": spec.server}
        self.running[name] = FakeContainer(name, lines, self.exit_codes.get(spec.gpu, 0), self.block,
                                           self.stderr.get(spec.gpu, ()), self.sleep, labels)
        self.running[name].pace = self.pace
        self.started.append((spec.job, spec.gpu, spec.command))
        return name

    def _training(self, spec):
        """The lines a worker prints for its command: iterations from --resume-from, a checkpoint line every
        --checkpoint-every iterations (naming --checkpoint-peer), a restored line when it resumes."""
        import json

        cmd = spec.command
        total, start = int(_arg(cmd, "--iterations")), int(_arg(cmd, "--resume-from", 0))
        every, peer = int(_arg(cmd, "--checkpoint-every", 0)), _arg(cmd, "--checkpoint-peer")
        lines = []
        if start:
            lines.append(json.dumps({"event": "restored", "iteration": start, "from": _arg(cmd, "--restore-from"),
                                     "writer": _arg(cmd, "--restore-writer")}))
        for i in range(start, total):
            lines.append(json.dumps({"event": "iteration", "iteration": i, "t_start": 10.0 + i, "t_end": 11.0 + i,
                                     "compute_s": 0.6, "comm_s": 0.4, "iter_s": 1.0, "gpu_util": 0.6, "bytes": 1}))
            if every and (i + 1) % every == 0 and i + 1 < total:
                lines.append(json.dumps({"event": "checkpoint", "iteration": i + 1, "writer": spec.gpu, "peer": peer}))
        lines.append(json.dumps({"event": "done", "check": "ok"}))
        return lines

    def kill_server(self, server, why="connection refused"):
        """A server dies: its engine stops answering and its workers' streams break."""
        self.engines.down[server] = why
        for c in self.running.values():
            if c.labels.get("server") == server:
                c.vanished = True

    def _get(self, job, gpu, server):
        import docker

        from controller.drivers.containers import container_name
        self._engine(server)
        name = container_name(job, gpu)
        if name not in self.running:
            raise docker.errors.NotFound(name)
        return self.running[name]

    def logs(self, job, gpu, server):
        return self._get(job, gpu, server).logs(stream=True, follow=True)

    def tail(self, job, gpu, server, lines):
        return self._get(job, gpu, server).logs(stdout=True, stderr=True, tail=lines).decode().splitlines()

    def wait(self, job, gpu, server):
        return self._get(job, gpu, server).wait()["StatusCode"]

    def kill(self, job, gpu, server):
        self._get(job, gpu, server).kill()

    def kill9(self, job, gpu, server):
        """`kill -9` of one worker from outside: it exits 137 (the controller did not stop it)."""
        c = self._get(job, gpu, server)
        c.killed = True

    def remove(self, job, gpu, server):
        from controller.drivers.containers import container_name
        self.running.pop(container_name(job, gpu), None)
        self.removed.append((job, gpu))

    def workers(self, server, job=None):
        self._engine(server)
        return [
            {"job": c.labels["job"], "gpu": c.labels["gpu"], "role": "worker",
             "status": "exited" if c.killed or not c.block else "running"}
            for c in self.running.values() if c.labels.get("server") == server and job in (None, c.labels["job"])
        ]

    def remove_volume(self, job, server):
        self._engine(server)
        self.volumes_removed.append((job, server))

    def sweep(self, server, keep_jobs, keep_gpus=None):
        stale = sorted((w["job"], w["gpu"]) for w in self.workers(server) if w["job"] not in keep_jobs
                       or (keep_gpus is not None and (w["job"], w["gpu"]) not in keep_gpus))
        for job, gpu in stale:
            self.remove(job, gpu, server)
        return [g for _, g in stale]
