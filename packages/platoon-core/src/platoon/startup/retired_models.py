"""The base models hosted Tinker no longer serves, each with the replacement it recommends: the start's capability
check names the replacement when a service no longer lists a model (`platoon config validate` says the same line).

Sources, as stored on 2026-12-07:
- hosted Tinker's "Model Deprecations" page (https://tinker-docs.thinkingmachines.ai/tinker/model-deprecations/),
  its "Recommended replacements" table: every row there was retired on 2026-06-12. The stored copy ends inside the
  table, so it gives the first five rows only.
- tinker-cookbook, the service's own recipes: "Migrate cookbook off the 2026-06-12 model lineup update" (#718) and
  "Migrate remaining recipes off the 2026-06-12 retired models" (#777) replace each retired model with the one
  named here; "Sync the research skills model lineup with the live Tinker lineup" (#841, 2026-07-25) drops from the
  lineup the models listed without a date. Where no source names a replacement, none is guessed.
Keep this table small: a name leaves it once no config could still carry it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RETIRED_MODELS", "Retired", "retired"]


class Retired(NamedTuple):
    """A retired model's recommended replacement (None where no source names one), the date it was retired (None
    where the sources give none) and a note on how to use the replacement."""

    replacement: str | None
    on: str | None = "2026-06-12"
    note: str = ""


#: retired model -> what hosted Tinker recommends instead
RETIRED_MODELS: dict[str, Retired] = {
    # the deprecations page's rows
    "Qwen/Qwen3.5-35B-A3B": Retired("Qwen/Qwen3.6-35B-A3B"),
    "Qwen/Qwen3.5-27B": Retired("Qwen/Qwen3.6-27B"),
    "Qwen/Qwen3-30B-A3B": Retired("Qwen/Qwen3.6-35B-A3B"),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": Retired("Qwen/Qwen3.6-35B-A3B", note="in non-thinking mode"),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": Retired("Qwen/Qwen3.6-35B-A3B"),
    # the cookbook's migration off the 2026-06-12 update
    "Qwen/Qwen3-4B-Instruct-2507": Retired(
        "Qwen/Qwen3.5-4B", note="in non-thinking mode: qwen3_5_disable_thinking"
    ),
    "Qwen/Qwen3-8B-Base": Retired("Qwen/Qwen3.5-9B-Base"),
    "Qwen/Qwen3-VL-235B-A22B-Instruct": Retired("Qwen/Qwen3.5-397B-A17B"),
    "meta-llama/Llama-3.1-8B-Instruct": Retired("Qwen/Qwen3.5-9B"),
    "meta-llama/Llama-3.1-8B": Retired("Qwen/Qwen3.5-9B-Base"),
    "meta-llama/Llama-3.2-3B": Retired("Qwen/Qwen3.5-9B-Base"),
    "meta-llama/Llama-3.2-1B": Retired("Qwen/Qwen3.5-9B-Base"),
    "moonshotai/Kimi-K2-Thinking": Retired("moonshotai/Kimi-K2.6"),
    "moonshotai/Kimi-K2.5": Retired("moonshotai/Kimi-K2.6"),
    # out of the lineup by 2026-07-25, with no replacement named
    "Qwen/Qwen3-235B-A22B-Instruct-2507": Retired(None, None),
    "Qwen/Qwen3-30B-A3B-Base": Retired(None, None),
    "Qwen/Qwen3-32B": Retired(None, None),
    "meta-llama/Llama-3.3-70B-Instruct": Retired(None, None),
    "meta-llama/Llama-3.1-70B": Retired(None, None),
    "deepseek-ai/DeepSeek-V3.1-Base": Retired(None, None),
}


def retired(model: str) -> str | None:
    """Why a retired model is gone and what to use instead (`hosted Tinker retired it on <date> and recommends
    <replacement> (<note>)`), else None."""
    found = RETIRED_MODELS.get(model)
    if found is None:
        return None
    when = (
        f"retired it on {found.on}" if found.on else "no longer serves it (not in its lineup of 2026-07-25)"
    )
    if found.replacement is None:
        return f"hosted Tinker {when}"
    note = f" ({found.note})" if found.note else ""
    return f"hosted Tinker {when} and recommends {found.replacement}{note}"
