"""Scheduler graph, pipelines, the pass manager and compile reports."""
from .graph import SchedulerGraph, VerificationError
from .report import CompileReport, last_report

__all__ = ["SchedulerGraph", "VerificationError", "CompileReport", "last_report"]
