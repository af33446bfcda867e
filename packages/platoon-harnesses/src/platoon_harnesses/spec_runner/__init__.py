"""The TOML spec runner: launches a command-line agent a spec describes, on the host or in the task sandbox, and
maps what it did to an `AgentResult`. Core reaches it only through the `platoon.spec_runners` entry point."""

from platoon_harnesses.spec_runner.runner import SpecRollout, SpecRunner

__all__ = ["SpecRollout", "SpecRunner"]
