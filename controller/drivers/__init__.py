"""Southbound drivers: OCS devices, the container runtime, namespace plumbing. The OpenFlow ones import Ryu (after
controller.ryu_compat, in openflow.py); the container drivers do not."""
