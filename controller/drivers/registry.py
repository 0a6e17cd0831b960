"""The OCS drivers by name. A rack file's ``driver:`` is one of the names below; each name's module declares, in its
``DRIVER``, what the driver is: the form of the rack file's ``address`` it takes, how it checks a rack file's entry,
the controller options it reads (credentials and such: ``--optirack-<driver>-<setting>``), and how it is built.
The rack file's schema, the controller's options and the OCS keeper ask this module; none of them names a driver.

A new driver is one module (its class and its ``DRIVER``) and one line in ``DRIVERS``. This module imports nothing of
the project: it finds a driver's module by name when that driver is first asked for, and a declaring module imports
no Ryu (a rack file is read by the simulator too, which has none).
"""
from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The rack file's name of a driver -> the module that declares it.
DRIVERS = {
    "openflow": "controller.drivers.ocs_openflow",
    "tl1": "controller.drivers.tl1",
    "netconf": "controller.drivers.netconf",
}
DEFAULT = "openflow"


@dataclass(frozen=True)
class Setting:
    """A controller option a driver reads: ``--optirack-<driver>-<name>`` (section [optirack])."""

    name: str
    default: str | float
    help: str
    secret: bool = False


@dataclass(frozen=True)
class Wiring:
    """What the controller hands a driver it builds: its settings' values by name, the runtime's lock factory and sleep,
    and, for a device that connects to the controller, the OpenFlow requests and how long a switch may take to
    confirm."""

    settings: dict[str, Any]
    lock: Callable[[], Any] = threading.Lock
    sleep: Callable[[float], None] = time.sleep
    of_rpc: Any = None
    barrier_timeout: float = 10.0


@dataclass(frozen=True)
class DriverKind:
    name: str
    summary: str  # one line: what device it drives, how
    address: str | None  # the rack file's address forms; None: the device connects to the controller, no address
    build: Callable[[Any, Wiring], Any]  # (the rack file's Ocs entry, Wiring) -> an OcsDriver
    check: Callable[[Any], None] | None = None  # the rack file's entry; raises ValueError saying what is wrong
    settings: tuple[Setting, ...] = ()


def names() -> list[str]:
    return list(DRIVERS)


def kind(name: str) -> DriverKind:
    """The declaration of driver `name`; ValueError lists the known ones."""
    if name not in DRIVERS:
        raise ValueError(f"unknown OCS driver {name!r} (known: {', '.join(DRIVERS)})")
    declared = importlib.import_module(DRIVERS[name]).DRIVER
    if declared.name != name:
        raise RuntimeError(f"{DRIVERS[name]} declares driver {declared.name!r}, listed as {name!r}")
    return declared


def check(spec) -> None:
    """A rack file's OCS entry against its driver: ValueError says what is wrong (no address where one is needed, an
    address where the device connects to us, an address of the wrong form)."""
    k = kind(spec.driver)
    if k.address is None and spec.address:
        raise ValueError(f"driver {k.name} takes no 'address' (the device connects to the controller)")
    if k.address is not None and not spec.address:
        raise ValueError(f"driver {k.name} needs 'address' ({k.address})")
    if k.check is not None:
        k.check(spec)


def settings() -> list[tuple[str, Setting]]:
    """Every driver's settings, as (driver, setting)."""
    return [(name, s) for name in DRIVERS for s in kind(name).settings]


def option_name(driver: str, setting: Setting) -> str:
    """The attribute of the [optirack] option group that holds a setting (``netconf_user``)."""
    return f"{driver}_{setting.name}".replace("-", "_")


def build(spec, conf, **wiring):
    """The driver of the rack file's OCS entry `spec`, its settings read from `conf` (the [optirack] options)."""
    check(spec)
    k = kind(spec.driver)
    values = {s.name.replace("-", "_"): getattr(conf, option_name(k.name, s)) for s in k.settings}
    return k.build(spec, Wiring(values, **wiring))
