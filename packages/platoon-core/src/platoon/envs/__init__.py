"""Environments: the service contract (`platoon.envs.service`), task tables, ORS and step environments.

Kept import-light: submodules are imported by name, never from here, so `import platoon.envs` costs nothing.
"""
