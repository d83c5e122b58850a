"""Trace-replay simulator on the pure scheduling core: virtual clock, in-memory plan applier, metrics and plots.

Entry points: `libs.sim.cli.main(argv)` (`gpupool sim fill|replay`) and `libs.sim.bench.main(argv)`
(`gpupool bench`). See docs/sim.md.
"""
