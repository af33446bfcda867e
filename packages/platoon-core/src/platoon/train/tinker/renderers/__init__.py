"""The stable import path of platoon's renderers: they live in `platoon.renderers`."""

from platoon.renderers import __all__ as __all__
from platoon.renderers import __dir__ as __dir__
from platoon.renderers import __getattr__ as __getattr__
