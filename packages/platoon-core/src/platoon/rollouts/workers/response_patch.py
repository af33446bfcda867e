"""The response-model patch: the SDK's `SampleResponse`/`SampledSequence` ignore fields they do not
declare, so a server's per-sequence `routing_id` would be dropped. The patch rebinds both, in `tinker` and
`tinker.types`, to subclasses that keep extra fields; the SDK looks `types.SampleResponse` up on every sample.
Newer SDKs (0.24 at the latest; 0.38 among them) decode samples into frozen dataclasses, which no model
configuration can widen: there the patch has nothing to do, and a routing id never reaches any process.
"""

from __future__ import annotations

from typing import Any

__all__ = ["patch_response_models", "response_patch_verified"]

_MARK = "__platoon_keeps_extra__"


def patch_response_models() -> bool:
    """Apply the patch once per process; returns whether a sequence's extra `routing_id` now survives (True as
    well where the SDK's responses are no pydantic models: there is nothing to patch)."""
    import tinker
    from pydantic import ConfigDict
    from tinker import types
    from tinker.types import sample_response, sampled_sequence

    if not _pydantic_responses():
        return True
    if not getattr(types.SampledSequence, _MARK, False):
        original_sequence: Any = types.SampledSequence
        original_response: Any = types.SampleResponse

        class SampledSequence(original_sequence):
            model_config = ConfigDict(frozen=True, extra="allow")

        class SampleResponse(original_response):
            model_config = ConfigDict(frozen=True, extra="allow")
            sequences: list[SampledSequence]

        for patched, original in ((SampledSequence, original_sequence), (SampleResponse, original_response)):
            patched.__module__ = original.__module__
            patched.__qualname__ = original.__qualname__
            setattr(patched, _MARK, True)
        SampleResponse.model_rebuild(force=True)
        for module in (tinker, types, sampled_sequence):
            module.SampledSequence = SampledSequence  # type: ignore[attr-defined]
        for module in (tinker, types, sample_response):
            module.SampleResponse = SampleResponse  # type: ignore[attr-defined]
    return response_patch_verified()


def response_patch_verified() -> bool:
    """Whether `tinker.types.SampleResponse` keeps a sequence's `routing_id` (checked on a made-up response), or is
    no pydantic model (nothing to patch)."""
    try:
        from tinker import types

        if not _pydantic_responses():
            return True

        response_type: Any = types.SampleResponse  # a pydantic model here (checked above)
        response = response_type.model_validate(
            {"sequences": [{"stop_reason": "stop", "tokens": [1], "routing_id": "r-1"}]}
        )
        extra = getattr(response.sequences[0], "__pydantic_extra__", None) or {}
        return extra.get("routing_id") == "r-1"
    except Exception:
        return False


def _pydantic_responses() -> bool:
    """Whether the SDK's `SampleResponse` is a pydantic model (0.16 is; 0.24 and 0.38 make it a frozen dataclass)."""
    from pydantic import BaseModel
    from tinker import types

    return issubclass(types.SampleResponse, BaseModel)
