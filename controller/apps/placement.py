"""The placement app: the Ryu wiring of the job service (controller/jobs/). It builds the service with the context's
runtime (`ctx.rt`) and the engines' container driver; other apps and the REST API reach the service as
`ctx.placement`."""

from __future__ import annotations

from ryu.base import app_manager

from controller.apps.context import Optirack
from controller.config import conf
from controller.drivers.containers import ContainerDriver
from controller.jobs.service import JobService


class PlacementApp(app_manager.RyuApp):
    _CONTEXTS = {"optirack": Optirack}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        ctx: Optirack = kwargs["optirack"]
        driver = kwargs.get("driver") or ContainerDriver(ctx.rack, conf().worker_image, nic_home=conf().nic_home)
        self.service = JobService(
            ctx,
            driver,
            kwargs.get("runtime") or ctx.rt,
            kwargs.get("engine_poll") or conf().engine_poll,
            hold_configuring=conf().fault_hold_configuring,
        )

    def __getattr__(self, name: str):
        """What the app lacks is the service's (tests and scripts hold the app)."""
        if name == "service":
            raise AttributeError(name)
        return getattr(self.service, name)
