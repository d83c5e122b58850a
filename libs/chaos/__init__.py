"""`gpupool chaos`: fault injection under load against its own `gpupool up`, `gpupool check` after every round.

suite.py runs the rounds and writes the report; load.py is the job load put on the platform meanwhile; work.py the
jobs whose commands must survive the agent being killed. See docs/chaos.md.
"""
