"""The Docker engine as the fault tests see it: the CLI (`PLATOON_DOCKER`, else `docker`) and the containers that
carry given labels. A command that fails fails the test, with the engine's words."""

from __future__ import annotations

import os
import subprocess

DOCKER = os.environ.get("PLATOON_DOCKER", "docker")


def docker(*args: str) -> list[str]:
    """Run the docker CLI; the words of its output (container ids, for `ps --quiet`)."""
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def containers(*labels: str, running_only: bool = False) -> list[str]:
    """The ids of the containers carrying every `key=value` label, stopped ones too unless `running_only`."""
    filters = [arg for label in labels for arg in ("--filter", f"label={label}")]
    return docker("ps", "--quiet", *([] if running_only else ["--all"]), *filters)
