"""The GPU worker: its program, its profiles and its image."""
