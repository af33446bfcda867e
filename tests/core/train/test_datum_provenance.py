"""Datum provenance: each datum names the sampled sequence behind every position (SDKs from 0.38), so that
stable_reinforce finds what the service recorded; the names survive every rebuild of the loss inputs, and gspo's
sequence ratio covers the action tokens."""

from __future__ import annotations

import dataclasses

import pytest
import tinker

from platoon.gateway.records import Interaction
from platoon.train.tinker.advantages import apply_depth_weighting
from platoon.train.tinker.datums import loss_datums, trajectory_datums
from platoon.trajectory import Trajectory, TrajectoryStep

pytestmark = pytest.mark.skipif(
    not hasattr(tinker.Datum, "with_provenance"), reason="SDKs before 0.38 give sampled sequences no id"
)

# Three calls on a growing conversation: the second and third prompts extend what came before (one merged datum);
# a fourth starts over (a second datum).
CALLS = {
    "c1": ([1, 2, 3], [4, 5], "seq-a"),
    "c2": ([1, 2, 3, 4, 5, 6, 7], [8], "seq-b"),
    "c3": ([1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11, 12], "seq-c"),
    "c4": ([20, 21], [22], "seq-d"),
}


def _interactions(with_ids: bool = True) -> dict[str, Interaction]:
    return {
        call_id: Interaction(
            call_id=call_id,
            prompt_tokens=tuple(prompt),
            sampled_tokens=tuple(sampled),
            logprobs=tuple(-0.1 * (i + 1) for i in range(len(sampled))),
            stop_reason="stop",
            sequence_id=sequence_id if with_ids else None,
        )
        for call_id, (prompt, sampled, sequence_id) in CALLS.items()
    }


def _trajectory() -> Trajectory:
    steps = [TrajectoryStep(misc={"action_misc": {"completion_id": call_id}}) for call_id in CALLS]
    return Trajectory(id="root", steps=steps)


def _spans(spans: list) -> list[tuple[str, str, int, int]]:
    return [
        (
            "sampled" if isinstance(s, tinker.types.SampledProvenanceSpan) else "prompt",
            s.sequence_id,
            s.offset,
            s.length,
        )
        for s in spans
    ]


def _check_tiling(datum: tinker.Datum) -> None:
    """Each target named by a sampled span is the token that sequence sampled at that offset."""
    sampled = {sequence_id: tokens for _, tokens, sequence_id in CALLS.values()}
    targets = datum.loss_fn_inputs["target_tokens"].data
    position = 0
    for kind, sequence_id, offset, length in _spans(datum.loss_fn_input_spans):
        if kind == "sampled":
            assert targets[position : position + length] == sampled[sequence_id][offset : offset + length]
        position += length
    assert position == len(targets)
    assert sum(s.length for s in datum.model_input_spans) == datum.model_input.length


def test_merged_calls_name_each_sampled_run_and_the_prompt_run_before_it() -> None:
    first, second = trajectory_datums(_trajectory(), _interactions(), 1.0)
    # targets = positions 1.. of 1 2 3 | 4 5 | 6 7 | 8 | 9 | 10 11 12: the first prompt run loses its first position
    assert _spans(first.loss_fn_input_spans) == [
        ("prompt", "seq-a", 1, 2),
        ("sampled", "seq-a", 0, 2),
        ("prompt", "seq-b", 5, 2),
        ("sampled", "seq-b", 0, 1),
        ("prompt", "seq-c", 8, 1),
        ("sampled", "seq-c", 0, 3),
    ]
    # the input is every position but the last: the last sampled run loses its last token
    assert _spans(first.model_input_spans)[-1] == ("sampled", "seq-c", 0, 2)
    assert _spans(second.loss_fn_input_spans) == [("prompt", "seq-d", 1, 1), ("sampled", "seq-d", 0, 1)]
    for datum in (first, second):
        _check_tiling(datum)


def test_a_call_without_a_sequence_id_leaves_its_datum_without_provenance() -> None:
    interactions = _interactions()
    interactions["c2"] = dataclasses.replace(interactions["c2"], sequence_id=None)
    first, second = trajectory_datums(_trajectory(), interactions, 1.0)
    assert first.loss_fn_input_spans is None and first.model_input_spans is None
    assert second.loss_fn_input_spans is not None
    (plain, _) = trajectory_datums(_trajectory(), _interactions(with_ids=False), 1.0)
    assert plain.loss_fn_input_spans is None


def test_provenance_survives_depth_weighting_and_reaches_stable_reinforce_alone() -> None:
    datums = trajectory_datums(_trajectory(), _interactions(), 0.5, depth=0)
    weighted, _ = apply_depth_weighting(datums, depth_level_weighting=True, depth_level_discount_gamma=None)
    for before, after in zip(datums, loss_datums(weighted, "stable_reinforce"), strict=True):
        assert after.loss_fn_input_spans == before.loss_fn_input_spans
        assert after.model_input_spans == before.model_input_spans
        assert "mask" not in after.loss_fn_inputs
    # the other losses read no provenance: they are sent datums without it
    for datum in loss_datums(weighted, "gspo") + loss_datums(weighted, "cispo"):
        assert datum.loss_fn_input_spans is None and datum.model_input_spans is None


def test_gspo_takes_its_sequence_ratio_over_the_action_tokens() -> None:
    datums = trajectory_datums(_trajectory(), _interactions(), 0.5)
    for before, after in zip(datums, loss_datums(datums, "gspo"), strict=True):
        # the sampled positions, not the prompt's (which carry no sampling logprob)
        assert after.loss_fn_inputs["sequence_ratio_mask"].data == before.loss_fn_inputs["mask"].data
    assert "sequence_ratio_mask" not in loss_datums(datums, "cispo")[0].loss_fn_inputs
