"""`gpupool bench`: every benchmark, each writing its own section of docs/benchmarks.md.

core.py (no subcommand: the scheduling core and the simulator), replay.py (the compressed openb replay per policy),
e2e.py (`platform`: load through the HTTP API of a real `gpupool up`, and the harness the others start it with),
run.py, backlog.py, reclaim.py, inventory.py; loadgen.py is the lean HTTP client they drive the gateway with, and
benchdoc.py writes a section and the one machine line every report carries.
"""
