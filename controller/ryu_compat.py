"""The one compatibility step that lets Ryu 4.34 run on Python 3.11; import before any Ryu module.

Ryu's wsgi module imports eventlet.wsgi.ALREADY_HANDLED at import time; eventlet removed it in
0.30.3, and no eventlet older than 0.33 imports on Python 3.11. Ryu uses it only as the return
value of websocket handlers, which optirack does not use, so a sentinel of our own is enough.
"""
import warnings

warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")

import eventlet.wsgi  # noqa: E402

if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
    eventlet.wsgi.ALREADY_HANDLED = object()
