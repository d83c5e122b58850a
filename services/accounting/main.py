"""`python -m services.accounting.main`: run the accounting service."""

from libs.runtime.service import run_service
from services.accounting.bootstrap import main

if __name__ == "__main__":
    run_service(main)
