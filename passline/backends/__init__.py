"""Backends that run a SchedulerGraph: the reference oracle (and Triton, see backends/triton)."""
