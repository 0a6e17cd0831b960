"""Thin Ryu apps over controller.core: the OCS, fabric, monitor, placement and REST apps."""

from controller import ryu_compat  # noqa: F401  (before any Ryu import)
