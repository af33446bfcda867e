"""`python -m platoon`: the same command line as the `platoon` script."""

import sys

from platoon.cli import main

if __name__ == "__main__":
    sys.exit(main())
