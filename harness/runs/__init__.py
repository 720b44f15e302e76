"""The commands that start work: simulator sweeps (locally or on Ray), training, the evidence runs, the demo, benchmarks and the TRL comparison."""
