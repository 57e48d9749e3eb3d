"""`python -m services.api`."""

from services.api.app import main

if __name__ == "__main__":
    main()
