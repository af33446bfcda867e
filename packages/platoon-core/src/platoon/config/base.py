"""The strict base of every config model: unknown keys are refused, and classes declare their hints and deprecations.

Class variables read by the loader (platoon.config.loader) and its message formatter:
- `UNKNOWN_KEY_HINTS`: key -> hint printed instead of a did-you-mean (`inference` in a training config, ...).
- `REQUIRED_KEY_HINTS`: key -> hint appended to "required key is missing".
- `DEPRECATED_KEYS`: key -> DeprecatedKey; such a key is accepted (and warned about) wherever it is set.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from platoon.deprecations import DeprecatedKey


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=False, frozen=False)

    UNKNOWN_KEY_HINTS: ClassVar[dict[str, str]] = {}
    REQUIRED_KEY_HINTS: ClassVar[dict[str, str]] = {}
    DEPRECATED_KEYS: ClassVar[dict[str, DeprecatedKey]] = {}
