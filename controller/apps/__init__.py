"""Thin Ryu apps over controller.core: the OCS, fabric, monitor, placement and REST apps."""
