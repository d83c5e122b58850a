"""`python -m services.agent.main`: run the node agent (GPUPOOL_AGENT_BACKEND=real|sim)."""

from libs.runtime.service import run_service
from services.agent.bootstrap import main

if __name__ == "__main__":
    run_service(main)
