"""`python -m services.inventory.main`: run the inventory service."""

from libs.runtime.service import run_service
from services.inventory.bootstrap import main

if __name__ == "__main__":
    run_service(main)
