"""optirack beside a lab's Slurm: Slurm decides which GPUs a job gets, optirack how they are wired.

`conf` writes Slurm's files from the rack file (nodes, GRES by GPU model, the fabric as a tree
topology from the live circuits); `allocation` reads which GPUs Slurm gave a job; `hook` is the
PrologSlurmctld/EpilogSlurmctld program that asks the controller to regroup and release them.
"""
