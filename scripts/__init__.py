"""Set-up, experiment runners, benchmarks and plots (run as `python -m scripts.NAME`)."""
