"""Datum provenance: which sampled sequence each position of a datum came from, as the spans of the SDK's
`Datum.with_provenance` (SDKs from 0.38). stable_reinforce needs them to find what the service recorded when it
sampled; a datum keeps them through every rebuild of its loss inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tinker

__all__ = ["PROVENANCE_LOSSES", "Run", "datum_with_provenance", "with_loss_inputs"]

#: the losses that read a datum's provenance; the others are sent datums without it (the service has no use for it)
PROVENANCE_LOSSES = ("stable_reinforce",)


@dataclass(frozen=True)
class Run:
    """`length` consecutive positions of a datum's full sequence: positions `offset..` of the sampled tokens of
    sequence `sequence_id` (`sampled`) or of the prompt of the request that sampled it."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


def _cut(runs: Sequence[Run], start: int, end: int) -> list[Any]:
    """The spans of positions `start..end` of the sequence the runs tile, in order."""
    from tinker.types import PromptProvenanceSpan, SampledProvenanceSpan

    spans: list[Any] = []
    position = 0
    for run in runs:
        low, high = max(start, position), min(end, position + run.length)
        if low < high:
            kind = SampledProvenanceSpan if run.sampled else PromptProvenanceSpan
            offset = run.offset + low - position
            spans.append(kind(sequence_id=run.sequence_id, offset=offset, length=high - low))
        position += run.length
    return spans


def datum_with_provenance(datum: tinker.Datum, runs: Sequence[Run]) -> tinker.Datum:
    """`datum` with the spans of the full sequence the runs tile: its input is every position but the last, its
    targets every position but the first (the standard shift)."""
    total = sum(run.length for run in runs)
    return datum.with_provenance(model_input=_cut(runs, 0, total - 1), loss_fn_inputs=_cut(runs, 1, total))


def with_loss_inputs(
    datum: tinker.Datum, inputs: Mapping[str, Any], *, provenance: bool = True
) -> tinker.Datum:
    """A copy of `datum` with other loss inputs, keeping its model input and (unless told not to) its provenance."""
    from tinker import Datum

    spans = getattr(datum, "loss_fn_input_spans", None)
    if spans is None or not provenance:
        return Datum(model_input=datum.model_input, loss_fn_inputs=dict(inputs))
    return Datum(
        model_input=datum.model_input,
        loss_fn_inputs=dict(inputs),
        model_input_spans=datum.model_input_spans,
        loss_fn_input_spans=spans,
    )
