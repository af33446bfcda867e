"""`platoon.eval.run:PlatoonEvalConfig`, the evaluation config class users name.

The evaluator will live here; the module stays light so naming the config class imports nothing heavy.
"""

from __future__ import annotations

from platoon.eval.config_defs import PlatoonEvalConfig

__all__ = ["PlatoonEvalConfig"]
