"""Harnesses: `platoon.harness` is both this package and the `@platoon.harness(name)` decorator.

The module object is callable (`pt.harness("acme-solver")(fn)`), so `import platoon as pt; @pt.harness(...)` and
`from platoon.harness.agent import AgentContext` both work.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from platoon.harness.function import harness

        return harness(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
