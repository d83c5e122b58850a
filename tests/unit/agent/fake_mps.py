"""A fake `nvidia-cuda-mps-control` that behaves as NVIDIA documents the real one: `-d` daemonizes and writes its pid
to <CUDA_MPS_PIPE_DIRECTORY>/nvidia-cuda-mps-control.pid; `quit` on stdin (with the same pipe directory) makes that
daemon exit. It logs the GPU it was started for."""

import sys

from services.agent.mps import PID_FILE

FAKE = f"""#!{sys.executable}
import os, sys, time
pipe, log = os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"]
if sys.argv[1:] == ["-d"]:
    if os.fork():
        sys.exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    with open(os.path.join(log, "control.log"), "a") as f:
        f.write("start " + os.environ.get("CUDA_VISIBLE_DEVICES", "") + "\\n")
    with open(os.path.join(pipe, "{PID_FILE}"), "w") as f:
        f.write(str(os.getpid()))
    quit_file = os.path.join(pipe, "quit")
    while not os.path.exists(quit_file):
        time.sleep(0.02)
    if os.environ.get("FAKE_MPS_STUBBORN"):
        time.sleep(3600)
    os.unlink(quit_file)
    os.unlink(os.path.join(pipe, "{PID_FILE}"))
    with open(os.path.join(log, "control.log"), "a") as f:
        f.write("quit\\n")
    os._exit(0)
command = sys.stdin.read().strip()
if command == "quit":
    open(os.path.join(pipe, "quit"), "w").close()
"""
