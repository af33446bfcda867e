"""The stable import path of the tool-call parsers: they live in `platoon.renderers.tool_parsers`."""

from platoon.renderers.tool_parsers import *  # noqa: F403
from platoon.renderers.tool_parsers import __all__ as __all__
