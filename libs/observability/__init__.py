"""Logging, tracing and metrics every gpupool process shares."""
