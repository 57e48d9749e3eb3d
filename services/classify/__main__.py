"""`python -m services.classify`."""

from services.classify.app import main

if __name__ == "__main__":
    main()
