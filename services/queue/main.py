"""`python -m services.queue.main`: run the queue service."""

from libs.runtime.service import run_service
from services.queue.bootstrap import main

if __name__ == "__main__":
    run_service(main)
