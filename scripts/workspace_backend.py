"""The workspace root's build backend: it refuses, naming the command that builds the packages.

The root is a virtual uv workspace: the distributions live under packages/. Without a backend of its own, a plain
`uv build` (or `pip wheel .`) here falls back to setuptools and makes an empty `unknown-0.0.0` distribution.
"""

from __future__ import annotations

import sys
from typing import NoReturn

REFUSAL = (
    "platoon: the repository root is a uv workspace, not a package: build every package with "
    "`uv build --all-packages` (or one with `uv build --package platoon-core`); the files land in dist/"
)


def _refuse(*_args: object, **_kwargs: object) -> NoReturn:
    # One line on stderr and a failed exit, which the frontend reports as the backend's error (no traceback).
    print(REFUSAL, file=sys.stderr)
    raise SystemExit(1)


build_wheel = build_sdist = build_editable = _refuse
get_requires_for_build_wheel = get_requires_for_build_sdist = get_requires_for_build_editable = _refuse
