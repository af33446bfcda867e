"""The base models hosted Tinker has retired, each with the replacement it recommends: the start's capability check
names the replacement when a service no longer lists a model (`platoon config validate` says the same line).

Source: hosted Tinker's "Model Deprecations" page (https://tinker-docs.thinkingmachines.ai/tinker/model-deprecations/),
its "Recommended replacements" table as stored on 2026-12-07; every row there has the retirement date 2026-06-12.
The stored copy ends inside the row of Qwen3-VL-30B-A3B-Instruct, whose replacement it gives only as "Qwen3.6...":
Qwen3.6-35B-A3B, the one Qwen3.6 mixture-of-experts model with a vision encoder, is written here for it. Keep this
table small: a name leaves it once no config could still carry it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RETIRED_MODELS", "Retired", "retired"]


class Retired(NamedTuple):
    """A retired model's recommended replacement, the date it was retired and a note on how to use the replacement."""

    replacement: str
    on: str
    note: str = ""


#: retired model -> what hosted Tinker recommends instead
RETIRED_MODELS: dict[str, Retired] = {
    "Qwen/Qwen3.5-35B-A3B": Retired("Qwen/Qwen3.6-35B-A3B", "2026-06-12"),
    "Qwen/Qwen3.5-27B": Retired("Qwen/Qwen3.6-27B", "2026-06-12"),
    "Qwen/Qwen3-30B-A3B": Retired("Qwen/Qwen3.6-35B-A3B", "2026-06-12"),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": Retired("Qwen/Qwen3.6-35B-A3B", "2026-06-12", "in non-thinking mode"),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": Retired("Qwen/Qwen3.6-35B-A3B", "2026-06-12"),
}


def retired(model: str) -> str | None:
    """`retired on <date>; hosted Tinker recommends <replacement> [note]` for a retired model, else None."""
    found = RETIRED_MODELS.get(model)
    if found is None:
        return None
    note = f" ({found.note})" if found.note else ""
    return f"hosted Tinker retired it on {found.on} and recommends {found.replacement}{note}"
