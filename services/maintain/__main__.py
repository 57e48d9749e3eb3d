"""`python -m services.maintain`."""

from services.maintain.app import main

if __name__ == "__main__":
    main()
