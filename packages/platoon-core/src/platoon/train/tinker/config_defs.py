"""The stable import path of the training config: it lives in `platoon.config.training`."""

from platoon.config.training import *  # noqa: F403
from platoon.config.training import __all__ as __all__
