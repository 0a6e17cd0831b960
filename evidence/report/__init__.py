"""`make report`: every results table of README.md and docs/ rebuilt from the committed records (engine.py;
the blocks of the benchmarks, the simulator, the trace check, the neighbours and Slurm in the modules beside it)."""
