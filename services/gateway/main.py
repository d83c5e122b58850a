"""`python -m services.gateway.main`: run the API gateway (uvicorn)."""

from services.gateway.bootstrap import main

if __name__ == "__main__":
    main()
