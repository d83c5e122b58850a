"""`python -m services.reclamation.main`: run the reclamation service."""

from libs.runtime.service import run_service
from services.reclamation.bootstrap import main

if __name__ == "__main__":
    run_service(main)
