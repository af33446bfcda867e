"""The old path of `platoon.startup.prepare`, kept because platoon-harbor's `harbor check` and `harbor images`
commands import the loading helpers from here; core imports the start-up room itself."""

from __future__ import annotations

from platoon.startup.prepare import cache_root_of, entry_label, load_environments, prepare_command

__all__ = ["cache_root_of", "entry_label", "load_environments", "prepare_command"]
