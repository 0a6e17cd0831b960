"""`optirack-controller`: ryu-manager's own main, with optirack's apps and defaults.

Every ryu-manager option works as usual (`optirack-controller --help`); with no app named on
the command line the optirack apps are loaded.
"""
from __future__ import annotations

import re
import signal
import sys
import warnings

warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
import eventlet  # noqa: E402
from eventlet import hubs  # noqa: E402

# Patch before anything creates a lock, as ryu-manager would have done after parsing options.
eventlet.monkey_patch()

import greenlet  # noqa: E402  (eventlet's own dependency)

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
    "controller.apps.slurm_api",  # beside Slurm: topology.conf kept to the live circuits
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


def stop_on_signals() -> None:
    """Ctrl-C (SIGINT) or SIGTERM stops the controller at once, closing its apps. Python raises an
    interrupt in whichever greenlet is running when the signal arrives; when that is not the main
    one (say the OpenFlow server's accept loop, whenever no switch is connected), eventlet's hub
    ends only that greenlet and the controller runs on. So the signal is handed to the main
    greenlet, which waits in ryu-manager's join and closes the apps when interrupted."""
    main_greenlet = greenlet.getcurrent()

    def interrupt(signum, _frame):
        interrupted = KeyboardInterrupt(signal.Signals(signum).name)
        hubs.get_hub().schedule_call_global(0, main_greenlet.throw, interrupted)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)


def show_defaults(conf) -> None:
    """Every command-line option's --help ends with its default (oslo.config prints none), secrets left out."""
    for info in getattr(conf, "_cli_opts", []):  # oslo.config's registry of command-line options (pinned version)
        opt = info["opt"]
        try:  # a default set by set_default (e.g. --wsapi-host 127.0.0.1) is kept beside the option
            default = conf._get_opt_info(opt.dest, info["group"].name if info["group"] else None).get(
                "default", opt.default)
        except Exception:  # noqa: BLE001 (an oslo.config without that registry: the option's own default)
            default = opt.default
        if default is None or default == "" or getattr(opt, "secret", False):
            continue
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        said = re.sub(r"\s*\(default:? [^)]*\)", "", opt.help or "").rstrip(".")  # Ryu's own, e.g. 0.0.0.0: ours differ
        opt.help = f"{said} (default: {shown})"


def main(argv: list[str] | None = None) -> None:
    stop_on_signals()
    conf = manager.CONF
    conf.set_default("app", DEFAULT_APPS)
    conf.set_default("ofp_listen_host", "127.0.0.1")
    conf.set_default("wsapi_host", "127.0.0.1")
    # Ryu sends no echo requests unless this is non-zero: a dead switch would go unnoticed.
    conf.set_default("maximum_unreplied_echo_requests", 3)
    conf.set_default("echo_request_interval", 5.0)
    show_defaults(conf)
    manager.main(args=bind_to_wsapi_host(sys.argv[1:] if argv is None else argv), prog="optirack-controller")


if __name__ == "__main__":
    main()
