"""`optirack-controller`: ryu-manager's own main, with optirack's apps and defaults.

Every ryu-manager option works as usual (`optirack-controller --help`); with no app named on
the command line the optirack apps are loaded.
"""
from __future__ import annotations

import sys
import warnings

warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
import eventlet  # noqa: E402

# Patch before anything creates a lock, as ryu-manager would have done after parsing options.
eventlet.monkey_patch()

# isort: off
from controller import ryu_compat  # noqa: E402,F401  (must precede every Ryu import)
from ryu.cmd import manager  # noqa: E402
from controller import config  # noqa: E402,F401  (registers --optirack-* options)
# isort: on

DEFAULT_APPS = [
    "controller.apps.inventory",  # which of the rack's datapaths are connected
    "controller.apps.ocs",  # circuits, through each OCS's driver
    "controller.apps.fabric",  # forwarding on the packet switches
    "controller.apps.monitor",  # port statistics
    "controller.apps.placement",  # jobs: placement, containers, regrouping
    "controller.apps.rest",  # the REST API
    "controller.apps.metrics",  # GET /metrics for Prometheus
    "controller.apps.live",  # the live page at /
]


def bind_to_wsapi_host(args: list[str]) -> list[str]:
    """`--bind ADDR` (or `--bind=ADDR`) is `--wsapi-host ADDR`: where REST, the live page and /metrics listen."""
    out = []
    for arg in args:
        if arg == "--bind":
            out.append("--wsapi-host")
        elif arg.startswith("--bind="):
            out.append("--wsapi-host=" + arg.split("=", 1)[1])
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    conf = manager.CONF
    conf.set_default("app", DEFAULT_APPS)
    conf.set_default("ofp_listen_host", "127.0.0.1")
    conf.set_default("wsapi_host", "127.0.0.1")
    # Ryu sends no echo requests unless this is non-zero: a dead switch would go unnoticed.
    conf.set_default("maximum_unreplied_echo_requests", 3)
    conf.set_default("echo_request_interval", 5.0)
    manager.main(args=bind_to_wsapi_host(sys.argv[1:] if argv is None else argv), prog="optirack-controller")


if __name__ == "__main__":
    main()
