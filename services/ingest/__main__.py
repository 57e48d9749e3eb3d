"""`python -m services.ingest`."""

from services.ingest.app import main

if __name__ == "__main__":
    main()
