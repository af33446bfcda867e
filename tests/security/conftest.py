"""The escape suite's support modules (escape_suite.py, attack.py) are importable by name."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
