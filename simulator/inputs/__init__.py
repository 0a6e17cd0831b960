"""What the simulator runs on: racks (files and generated), traces and workloads, the paper's cases, a `make demo`
record's format."""
