"""`python -m services.embed`."""

from services.embed.app import main

if __name__ == "__main__":
    main()
