"""Trace-replay simulator on the pure scheduling core: virtual clock, in-memory plan applier, metrics and plots.

Entry point: `libs.sim.cli.main(argv)` (`gpupool sim fill|replay`); its benchmarks (`gpupool bench`, `gpupool bench
replay`) are in libs/bench. See docs/sim.md.
"""
