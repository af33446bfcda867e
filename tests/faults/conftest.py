"""The fault suite's environment modules (faulty_grader.py, sampler_proxy.py) are importable by name, as the runs
under test import them, and so are its Docker helpers (docker_cli.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
