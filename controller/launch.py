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
import eventlet.wsgi  # noqa: E402

# The one compatibility step. Ryu 4.34's wsgi module imports eventlet.wsgi.ALREADY_HANDLED at
# import time; eventlet removed it in 0.30.3, and no eventlet older than 0.33 imports on Python
# 3.11. Ryu uses it only as the return value of websocket handlers, which optirack does not
# use, so a sentinel of our own lets ryu-manager start. It must be set before Ryu is imported.
if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
    eventlet.wsgi.ALREADY_HANDLED = object()

from ryu.cmd import manager  # noqa: E402  (must follow the step above)

from controller import config  # noqa: E402,F401  (registers --optirack-* options)

DEFAULT_APPS = [
    "controller.apps.inventory",
]


def main(argv: list[str] | None = None) -> None:
    conf = manager.CONF
    conf.set_default("app", DEFAULT_APPS)
    conf.set_default("ofp_listen_host", "127.0.0.1")
    conf.set_default("wsapi_host", "127.0.0.1")
    # Ryu sends no echo requests unless this is non-zero: a dead switch would go unnoticed.
    conf.set_default("maximum_unreplied_echo_requests", 3)
    conf.set_default("echo_request_interval", 5.0)
    manager.main(args=sys.argv[1:] if argv is None else argv, prog="optirack-controller")


if __name__ == "__main__":
    main()
