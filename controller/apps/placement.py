"""The placement app: starts the job service (controller/jobs/) that the controller's wiring built
(controller/apps/context.py: from the rack state, the circuit changes, the containers and the runtime)."""

from __future__ import annotations

from ryu.base import app_manager

from controller.apps.context import Optirack
from controller.jobs.service import JobService


class PlacementApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ctx: Optirack = kwargs["optirack"]
        self.service: JobService = ctx.jobs
        self.service.start()
