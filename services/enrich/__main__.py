"""`python -m services.enrich`."""

from services.enrich.app import main

if __name__ == "__main__":
    main()
