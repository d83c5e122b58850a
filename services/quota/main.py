"""`python -m services.quota.main`: run the quota service."""

from libs.runtime.service import run_service
from services.quota.bootstrap import main

if __name__ == "__main__":
    run_service(main)
