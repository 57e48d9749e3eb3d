"""`python -m services.cluster`."""

from services.cluster.app import main

if __name__ == "__main__":
    main()
