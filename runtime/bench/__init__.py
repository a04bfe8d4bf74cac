"""Benchmarks: workloads, simulated policy sweeps, metrics and reports; control-core overhead."""
