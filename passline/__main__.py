"""`python -m passline ...`: the `passline` command (passline/cli.py) without the installed script."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
