"""Southbound drivers: OCS devices, the container runtime, namespace plumbing."""

from controller import ryu_compat  # noqa: F401  (before any Ryu import)
