"""Namespace plumbing with `ip` (argument lists only): pin a namespace by name, move and address a NIC.

This is the CNI host-device pattern: the GPU's NIC leaves its home namespace (the server's, or on
a real host the root namespace) for the container's, and comes back when the container goes.
"""
from __future__ import annotations

import subprocess


class NetnsError(RuntimeError):
    pass


def run(*cmd: str, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc.stdout


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    return run("ip", *(["-n", netns] if netns else []), *args, check=check)


def in_netns(netns: str | None, *cmd: str, check: bool = True) -> str:
    return run(*(["ip", "netns", "exec", netns] if netns else []), *cmd, check=check)


def names() -> list[str]:
    """The named network namespaces."""
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()]


def exists(name: str) -> bool:
    return name in names()


def attach(name: str, pid: int) -> None:
    """Pin the network namespace of process `pid` as `name`: it outlives the process."""
    run("ip", "netns", "attach", name, str(pid))


def delete(name: str) -> None:
    if exists(name):
        run("ip", "netns", "delete", name)


def has_link(ifname: str, netns: str | None) -> bool:
    return subprocess.run(["ip", *(["-n", netns] if netns else []), "link", "show", "dev", ifname],
                          capture_output=True).returncode == 0


def move_link(ifname: str, src: str | None, dst: str) -> None:
    """Move an interface from namespace `src` (None: the root namespace) to the named namespace `dst`."""
    ip("link", "set", "dev", ifname, "netns", dst, netns=src)


def move_link_to_root(ifname: str, src: str) -> None:
    ip("link", "set", "dev", ifname, "netns", "1", netns=src)


def address(ifname: str, netns: str | None, cidr: str) -> None:
    """Give an interface its one address, bring it up, and turn transmit checksum offload off
    (TCP through userspace OVS over veth stalls with it on)."""
    ip("addr", "flush", "dev", ifname, netns=netns)
    ip("addr", "replace", cidr, "dev", ifname, netns=netns)  # one another actor (the NIC helper) gave it meanwhile
    ip("link", "set", "dev", ifname, "up", netns=netns)
    in_netns(netns, "ethtool", "-K", ifname, "tx", "off", check=False)
