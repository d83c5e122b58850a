"""`python -m services.placement.main`: run the placement service."""

from libs.runtime.service import run_service
from services.placement.bootstrap import main

if __name__ == "__main__":
    run_service(main)
