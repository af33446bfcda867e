"""`python -m platoon.viz ...`: the viewer's command line, as `platoon viz ...` runs it."""

import sys

from platoon.viz.cli import main

sys.exit(main(prog="python -m platoon.viz"))
