"""`python -m platoon.viz ...`: the viewer's command line, as `platoon viz ...` runs it."""

import sys

from platoon.viz.cli import main

if __name__ == "__main__":  # importing the module (as the import-boundary tests do) runs nothing
    sys.exit(main(prog="python -m platoon.viz"))
