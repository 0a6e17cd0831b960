"""Studies over many runs: a workload under each policy, `optirack sweep` and its figures, a run's metrics."""
