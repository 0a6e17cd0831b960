"""`make demo`: the paper's experiment on the emulated rack (experiment.py: settings, racks, the record; runs.py: the
runs; checks.py: what a record is checked for)."""
