"""Southbound drivers: OCS devices, the container runtime, namespace plumbing."""
