"""The local server's stability records: what it sampled, kept by `sequence_id`, for stable_reinforce.

A sample request with `record_stability_info` keeps each sequence's tokens and the sampler's own logprobs. A training
datum names the sequence behind each of its targets in `loss_fn_input_spans` (the SDK's `Datum.with_provenance`);
`StabilityStore.attach` checks those names and gives stable_reinforce the recorded logprobs. As on hosted Tinker, a
record belongs to the session that sampled it and lasts a day after its last use.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from platoon.local_server.losses import NEEDS_STABILITY_RECORDS, RECORDED_LOGPROBS, RECORDED_MASK

__all__ = ["MAX_RECORDS", "RETENTION_SECONDS", "SequenceRecord", "Span", "StabilityStore", "parse_spans"]

#: a record lasts this long after the last request that used it (hosted Tinker keeps them a day)
RETENTION_SECONDS = 86400.0
#: the most records kept; past it the least recently used goes first (a long run samples without end)
MAX_RECORDS = 200_000

_KINDS = {"sampled_tokens": "sampled", "prompt_tokens": "prompt"}


@dataclass(frozen=True)
class SequenceRecord:
    """One sampled sequence: its session (None when the sampler was made without one), tokens and logprobs."""

    session_id: str | None
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class Span:
    """One run of a datum's provenance: `length` positions from `offset` of a sequence's sampled tokens
    (`sampled`) or of the prompt of the request that sampled it (`prompt`)."""

    kind: str
    sequence_id: str
    offset: int
    length: int


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_spans(raw: Any, where: str) -> list[Span]:
    """A datum's spans as the wire carries them: a list of `{"sampled_tokens" | "prompt_tokens": {sequence_id,
    offset, length}}`; anything else is a ValueError naming `where`."""
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list of provenance spans")
    spans = []
    for index, item in enumerate(raw):
        here = f"{where}[{index}]"
        arms = [key for key in _KINDS if isinstance(item, dict) and key in item]
        if len(arms) != 1:
            raise ValueError(f"{here} must hold one of 'sampled_tokens' or 'prompt_tokens'")
        fields = item[arms[0]] if isinstance(item[arms[0]], dict) else {}
        sequence_id, offset, length = (
            fields.get("sequence_id"),
            fields.get("offset", 0),
            fields.get("length", 0),
        )
        if not isinstance(sequence_id, str) or not sequence_id:
            raise ValueError(f"{here} needs a sequence_id (a SampledSequence.sequence_id)")
        if not (_count(offset) and _count(length)):
            raise ValueError(
                f"{here}: offset and length must be non-negative integers, got {offset!r}, {length!r}"
            )
        spans.append(Span(_KINDS[arms[0]], sequence_id, int(offset), int(length)))
    return spans


class StabilityStore:
    """Stability records by sequence id, least recently used first; safe to use from the server's threads."""

    def __init__(
        self,
        *,
        retention_seconds: float = RETENTION_SECONDS,
        max_records: int = MAX_RECORDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retention_seconds = retention_seconds
        self.max_records = max_records
        self._clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, tuple[float, SequenceRecord]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    @staticmethod
    def new_ids(count: int) -> list[str]:
        """Fresh sequence ids for one sample request, fixed when it is submitted (the SDK reads them then)."""
        stem = uuid.uuid4().hex
        return [f"seq-{stem}-{index}" for index in range(count)]

    def record(
        self, sequence_id: str, *, session_id: str | None, tokens: Sequence[int], logprobs: Sequence[float]
    ) -> None:
        """Keep one sampled sequence's tokens and the sampler's logprobs of them."""
        if len(tokens) != len(logprobs):
            raise ValueError(f"sequence {sequence_id}: {len(tokens)} tokens but {len(logprobs)} logprobs")
        entry = SequenceRecord(session_id, tuple(map(int, tokens)), tuple(map(float, logprobs)))
        with self._lock:
            now = self._clock()
            self._expire(now)
            self._records[sequence_id] = (now, entry)
            self._records.move_to_end(sequence_id)
            while len(self._records) > self.max_records:
                self._records.popitem(last=False)

    def lookup(self, sequence_id: str) -> SequenceRecord | None:
        """The record of `sequence_id`, its day restarted; None when unknown or expired."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            found = self._records.get(sequence_id)
            if found is None:
                return None
            self._records[sequence_id] = (now, found[1])
            self._records.move_to_end(sequence_id)
            return found[1]

    def _expire(self, now: float) -> None:
        while self._records:
            used, _ = next(iter(self._records.values()))
            if now - used <= self.retention_seconds:
                return
            self._records.popitem(last=False)

    def recorded_inputs(
        self, spans: Sequence[Span], targets: Sequence[int], *, session_id: str | None, where: str
    ) -> tuple[list[float], list[float]]:
        """For each target: the sampler's recorded logprob and 1.0 where its span names sampled tokens (0.0 and
        0.0 on prompt runs). Refuses (ValueError, one line) spans that do not tile the targets, a sequence this
        server holds no record of or that another session sampled, and a target that is not the token sampled."""
        covered = sum(span.length for span in spans)
        if covered != len(targets):
            raise ValueError(
                f"{where}: the provenance spans cover {covered} positions but the datum has {len(targets)} targets "
                "(the spans must tile loss_fn_inputs['target_tokens'])"
            )
        logprobs = [0.0] * len(targets)
        mask = [0.0] * len(targets)
        position = 0
        for span in spans:
            record = self.lookup(span.sequence_id)
            if record is None:
                raise ValueError(
                    f"{where}: unknown sequence_id {span.sequence_id!r}: this server holds no stability record of "
                    "it (sample with record_stability_info=True; a record lasts a day after its last use)"
                )
            if session_id is not None and record.session_id is not None and record.session_id != session_id:
                raise ValueError(
                    f"{where}: sequence {span.sequence_id!r} was sampled in session {record.session_id!r}; a "
                    f"training request of session {session_id!r} can name only its own session's sequences"
                )
            if span.kind == "sampled":
                end = span.offset + span.length
                if end > len(record.tokens):
                    raise ValueError(
                        f"{where}: a span covers sampled tokens {span.offset}..{end} of sequence "
                        f"{span.sequence_id!r}, which sampled {len(record.tokens)}"
                    )
                for step in range(span.length):
                    index, sampled = position + step, span.offset + step
                    if int(targets[index]) != record.tokens[sampled]:
                        raise ValueError(
                            f"{where}: target {index} is token {int(targets[index])}, but sequence "
                            f"{span.sequence_id!r} sampled token {record.tokens[sampled]} at offset {sampled}"
                        )
                    logprobs[index] = record.logprobs[sampled]
                    mask[index] = 1.0
            position += span.length
        return logprobs, mask

    def attach(
        self, datums: Sequence[dict[str, Any]], loss_fn: str, *, session_id: str | None, where: str
    ) -> None:
        """For a loss that reads stability records (stable_reinforce): check every datum's `loss_fn_input_spans`
        and set the recorded logprobs and their mask as its loss inputs. ValueError (one line) for what is refused.
        The other losses have no use for provenance: theirs is not read."""
        if loss_fn not in NEEDS_STABILITY_RECORDS:
            return
        for index, datum in enumerate(datums):
            here = f"{where}.data[{index}]"
            raw = datum.get("loss_fn_input_spans")
            if raw is None:
                raise ValueError(
                    f"{here}: loss {loss_fn!r} needs loss_fn_input_spans naming the sampled sequence of every "
                    "target (sample with record_stability_info=True; attach them with Datum.with_provenance)"
                )
            spans = parse_spans(raw, f"{here}.loss_fn_input_spans")
            targets = datum["loss_fn_inputs"]["target_tokens"]["data"]
            logprobs, mask = self.recorded_inputs(spans, targets, session_id=session_id, where=here)
            inputs = datum["loss_fn_inputs"]
            inputs[RECORDED_LOGPROBS] = {"data": logprobs, "dtype": "float32", "shape": [len(logprobs)]}
            inputs[RECORDED_MASK] = {"data": mask, "dtype": "float32", "shape": [len(mask)]}
