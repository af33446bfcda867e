"""Training datums from the exact sampled tokens: prefix merging of a trajectory's calls,
policy exclusion, subagent datum sampling, sign-aware error filtering, the zero-advantage filter and the loss inputs.

Nothing is re-tokenized: prompts and sampled tokens come from the gateway's interaction records.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Literal

from platoon import hooks
from platoon.train.tinker.advantages import GroupResult, is_skipped, trajectory_depths
from platoon.train.tinker.provenance import PROVENANCE_LOSSES, Run, datum_with_provenance, with_loss_inputs

if TYPE_CHECKING:
    import tinker

    from platoon.gateway.records import Interaction
    from platoon.trajectory import Trajectory, TrajectoryCollection

__all__ = [
    "PRIVATE_KEYS",
    "ZERO_OBJECTIVE_LOSSES",
    "DatumBatch",
    "DatumStats",
    "collection_datums",
    "error_completion_ids",
    "filter_error_tokens",
    "filter_zero_advantage_datums",
    "group_datums",
    "keep_subagent_datum",
    "loss_datums",
    "message_completion_ids",
    "trajectory_datums",
    "zero_objective",
]

#: the dtypes of the loss inputs platoon sends (the SDK types them as these literals)
Dtype = Literal["int64", "float32"]

log = logging.getLogger("platoon.train")

ERROR_MASK = "error_mask"
#: the preserved action-token count the zero-advantage filter leaves on the first retained datum
LOSS_TOKEN_COUNT = "loss_token_count"
#: loss inputs that never reach the service
PRIVATE_KEYS = ("mask", "checkpoint_version", "traj_depth", "traj_start", LOSS_TOKEN_COUNT, ERROR_MASK)
#: losses whose objective is exactly zero when every advantage is
ZERO_OBJECTIVE_LOSSES = ("cispo", "ppo", "importance_sampling", "gspo")
_CLIP_KEYS = frozenset({"clip_low_threshold", "clip_high_threshold"})


@dataclass
class DatumStats:
    """Conversion counters; the datum funnel is `retained <= post_sampling <= policy_eligible <= postmerge`."""

    trajectories: int = 0  # converted (not skipped)
    skipped_trajectories: int = 0  # exclude_from_training or verifier: no stats beyond this count
    policy_excluded_trajectories: int = 0
    calls: int = 0  # distinct recorded calls turned into tokens
    merged_calls: int = 0  # calls appended to the previous call's datum
    excluded_steps: int = 0  # steps marked exclude_from_training
    steps_without_id: int = 0
    duplicate_calls: int = 0  # steps repeating a call id already used in the trajectory
    missing_calls: int = 0  # call ids absent from the interaction map
    tokens_before_merge: int = 0  # sum over calls of prompt + sampled tokens
    tokens_after_merge: int = 0  # sum over datums of their full sequences
    postmerge_datums: int = 0
    policy_eligible_datums: int = 0
    post_sampling_datums: int = 0
    retained_datums: int = 0
    policy_excluded_datums: int = 0
    message_masked_tokens: int = 0
    error_detected_action_tokens: int = 0
    error_suppressed_positive_action_tokens: int = 0
    error_retained_nonpositive_action_tokens: int = 0
    error_emptied_datums: int = 0
    empty_datums: int = 0  # datums without any action token, dropped (message-only calls)

    def add(self, other: DatumStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_metrics(self) -> dict[str, float]:
        """`datums/<counter>` for the counters and `error_filter/...` for the error filter."""
        metrics: dict[str, float] = {}
        for f in fields(self):
            value = float(getattr(self, f.name))
            if f.name.startswith("error_"):
                metrics[f"error_filter/{f.name.removeprefix('error_')}"] = value
            else:
                metrics[f"datums/{f.name}"] = value
        return metrics


@dataclass
class DatumBatch:
    """Datums with the stats and metrics of their conversion."""

    datums: list[tinker.Datum] = field(default_factory=list)
    stats: DatumStats = field(default_factory=DatumStats)
    metrics: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------
# Detection


def _step_reports_error(misc: Mapping[str, Any]) -> bool:
    if misc.get("error"):  # CodeAct records the exception of the executed code
        return True
    output = misc.get("output")
    if isinstance(output, str) and "traceback" in output.lower():
        return True
    for key in ("observations", "events", "tool_results"):
        events = misc.get(key)
        if (
            isinstance(events, Sequence)
            and not isinstance(events, str)
            and any(isinstance(e, Mapping) and e.get("is_error") is True for e in events)
        ):
            return True
    return False


def _hook_ids(name: str, steps: list[Any]) -> set[str]:
    found: set[str] = set()
    for fn in hooks.hooks(name):
        answer = fn(steps)
        if answer:
            found.update(str(call_id) for call_id in answer)
    return found


def error_completion_ids(trajectory: Trajectory) -> set[str]:
    """Call ids whose actions failed: a step misc `error`, an `output` with a traceback, an `is_error` tool event
    (step misc, or the trajectory's `tool_calls` entries by the call that issued them), or a hook's ids."""
    ids: set[str] = set()
    call_ids = [_call_id(step.misc) for step in trajectory.steps]
    for step, call_id in zip(trajectory.steps, call_ids, strict=True):
        if call_id is not None and _step_reports_error(step.misc):
            ids.add(call_id)
    for entry in trajectory.misc.get("tool_calls") or ():
        # `step` counts the model calls made before the tool call: the call that issued it is the one before.
        if isinstance(entry, Mapping) and entry.get("is_error") is True:
            index = entry.get("step")
            if isinstance(index, int) and 1 <= index <= len(call_ids) and call_ids[index - 1] is not None:
                ids.add(str(call_ids[index - 1]))
    ids.update(_hook_ids("trajectory.error_completion_ids", trajectory.steps))
    return ids


def message_completion_ids(trajectory: Trajectory) -> set[str]:
    """Call ids that only sent a message, as `trajectory.message_completion_ids` hooks report them."""
    return _hook_ids("trajectory.message_completion_ids", trajectory.steps)


# --------------------------------------------------------------------------------------------------------------
# One trajectory


def _call_id(misc: Mapping[str, Any]) -> str | None:
    action = misc.get("action_misc")
    call_id = action.get("completion_id") if isinstance(action, Mapping) else None
    return None if call_id is None else str(call_id)


def _flatten_prompt(prompt: Any) -> tuple[list[Any], bool]:
    """Prompt tokens as a list: ints, and non-text chunks kept whole as opaque elements; and whether any is."""
    if type(prompt) is tuple:  # an Interaction's prompt_tokens: the gateway records them as Python ints
        return list(prompt), False
    chunks = getattr(prompt, "chunks", None)
    if chunks is None:
        return list(map(int, prompt)), False
    items: list[Any] = []
    opaque = False
    for chunk in chunks:
        tokens = getattr(chunk, "tokens", None)
        if tokens is not None and getattr(chunk, "type", "encoded_text") == "encoded_text":
            items.extend(map(int, tokens))
        else:
            items.append(chunk)
            opaque = True
    return items, opaque


def _width(item: Any) -> int:
    return 1 if isinstance(item, int) else int(item.length)


def _routing_handle(routing_id: Any) -> int | None:
    # The service routes by an int64 handle; an id that is not an integer cannot be sent as one.
    if routing_id is None:
        return None
    try:
        return int(routing_id)
    except (TypeError, ValueError):
        return None


class _Accumulator:
    """The running merged sequence: items (ints or opaque chunks), their logprobs, and the spans of positions that
    share an advantage, a mask and an error flag (a call's prompt delta, its sampled tokens)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.logprobs: list[float] = []
        #: (width, advantage, mask, error) per span, in order: arrays of constants built once, in `datum`
        self.spans: list[tuple[int, float, float, bool]] = []
        self.routing: int | None = None
        #: whether any item is an opaque (non-text) chunk; without one every item is a token (the fast paths)
        self.opaque = False
        #: the sampled sequence behind every position; None once a call came without a sequence id
        self.runs: list[Run] | None = []

    def is_prefix_of(self, prompt: list[Any]) -> bool:
        n = len(self.items)
        return n <= len(prompt) and prompt[:n] == self.items

    def context(self, items: Sequence[Any], opaque: bool, sequence_id: str | None = None) -> None:
        """Prompt items of the call that sampled `sequence_id`, from where the running sequence ends."""
        width = sum(_width(item) for item in items) if opaque else len(items)
        self._provenance(Run(False, sequence_id, len(self.logprobs), width) if sequence_id else None)
        self.opaque = self.opaque or opaque
        self.items.extend(items)
        self.logprobs.extend([0.0] * width)
        self.spans.append((width, 0.0, 0.0, False))

    def action(
        self,
        tokens: Sequence[int],
        logprobs: Sequence[float],
        advantage: float,
        trained: bool,
        error: bool,
        sequence_id: str | None = None,
    ) -> None:
        if len(tokens) != len(logprobs):
            raise ValueError(f"{len(tokens)} sampled tokens but {len(logprobs)} logprobs")
        self._provenance(Run(True, sequence_id, 0, len(tokens)) if sequence_id else None)
        self.items.extend(map(int, tokens))
        self.logprobs.extend(map(float, logprobs))
        trains = 1.0 if trained else 0.0
        self.spans.append((len(tokens), advantage if trained else 0.0, trains, error and trained))

    def _provenance(self, run: Run | None) -> None:
        if self.runs is None:
            return
        if run is None:
            self.runs = None  # a position of unknown origin: the datum carries no provenance at all
        elif run.length:
            self.runs.append(run)

    def datum(self, extra: Mapping[str, tuple[list[Any], Dtype]]) -> tinker.Datum:
        """The standard shift: input = all but the last position, targets/arrays = all but the first."""
        from tinker import Datum, EncodedTextChunk, ModelInput, TensorData

        if not self.items or not isinstance(self.items[-1], int):
            raise ValueError("a datum ends with a sampled token")
        chunks: list[Any] = []
        targets: list[int] = []
        if not self.opaque:
            targets = list(self.items)
            chunks.append(EncodedTextChunk(tokens=self.items[:-1]))  # the last position is only a target
        else:
            run: list[int] = []
            for item in self.items:
                if isinstance(item, int):
                    run.append(item)
                    targets.append(item)
                else:
                    if run:
                        chunks.append(EncodedTextChunk(tokens=run))
                        run = []
                    chunks.append(item)
                    targets.extend([0] * _width(item))  # opaque positions have no token to predict
            run.pop()  # the last position is only ever a target
            if run:
                chunks.append(EncodedTextChunk(tokens=run))
        length = len(targets) - 1
        per_position = _per_position_arrays if is_dataclass(TensorData) else _per_position_lists
        widths = [span[0] for span in self.spans]
        arrays: dict[str, tuple[Any, Dtype]] = {
            "target_tokens": (targets[1:], "int64"),
            "logprobs": (self.logprobs[1:], "float32"),
            "advantages": (per_position(widths, [span[1] for span in self.spans]), "float32"),
            "mask": (per_position(widths, [span[2] for span in self.spans]), "float32"),
        }
        if any(span[3] and span[0] for span in self.spans):
            errors = [1.0 if span[3] else 0.0 for span in self.spans]
            arrays[ERROR_MASK] = (per_position(widths, errors), "float32")
        inputs: dict[str, Any] = {}
        for key, (data, dtype) in arrays.items():
            if len(data) != length:
                raise AssertionError(f"datum {key} has {len(data)} positions for {length} inputs")
            inputs[key] = TensorData(data=data, dtype=dtype, shape=[length])
        for key, (data, dtype) in extra.items():
            inputs[key] = TensorData(data=data, dtype=dtype, shape=[len(data)])
        if self.routing is not None:
            inputs["routing_handle"] = TensorData(data=[self.routing], dtype="int64", shape=[1])
        datum = Datum(model_input=ModelInput(chunks=chunks), loss_fn_inputs=inputs)
        # Only SDKs from 0.38 give sequences ids, and only their datums carry provenance.
        return (
            datum_with_provenance(datum, self.runs)
            if self.runs and hasattr(datum, "with_provenance")
            else datum
        )


def _per_position_arrays(widths: list[int], values: list[float]) -> Any:
    """Each value repeated over its span's width, all but the first position, as float32: an SDK whose
    `TensorData` keeps a numpy array (0.38) takes it as it is, with no list of floats to convert."""
    import numpy as np

    return np.repeat(np.array(values, dtype=np.float32), widths)[1:]


def _per_position_lists(widths: list[int], values: list[float]) -> list[float]:
    """`_per_position_arrays` as a list, for SDKs whose `TensorData` holds a list."""
    return list(
        itertools.chain.from_iterable(itertools.repeat(v, w) for w, v in zip(widths, values, strict=True))
    )[1:]


def trajectory_datums(
    trajectory: Trajectory,
    interactions: Mapping[str, Interaction],
    advantage: float,
    *,
    checkpoint_version: int = 0,
    depth: int | None = None,
    error_ids: Collection[str] = (),
    message_ids: Collection[str] = (),
    stats: DatumStats | None = None,
) -> list[tinker.Datum]:
    """The datums of one trajectory, its calls prefix-merged.

    A call merges into the running datum only when the accumulated tokens (the previous prompts and *sampled*
    tokens) are an exact prefix of its prompt; otherwise the running datum is flushed. Sampled tokens carry their
    sampled logprobs, `advantage` and mask 1 (mask 0 and advantage 0 for `message_ids`); prompt deltas carry 0s.
    `error_ids` add a private `error_mask`; `depth` adds `traj_depth` and `traj_start` (1.0 on the first datum).
    """
    stats = stats if stats is not None else DatumStats()
    seen: set[str] = set()
    acc = _Accumulator()
    sequences: list[_Accumulator] = []
    for step in trajectory.steps:
        if step.misc.get("exclude_from_training"):
            stats.excluded_steps += 1
            continue
        call_id = _call_id(step.misc)
        if call_id is None:
            stats.steps_without_id += 1
            continue
        if call_id in seen:  # one sampled response may span several steps
            stats.duplicate_calls += 1
            continue
        seen.add(call_id)
        interaction = interactions.get(call_id)
        if interaction is None:
            stats.missing_calls += 1
            log.warning("trajectory %s: call %s has no recorded interaction; skipped", trajectory.id, call_id)
            continue
        prompt, opaque = _flatten_prompt(interaction.prompt_tokens)
        sampled = list(interaction.sampled_tokens)
        stats.calls += 1
        width = sum(_width(item) for item in prompt) if opaque else len(prompt)
        stats.tokens_before_merge += width + len(sampled)
        sequence_id = interaction.sequence_id
        if acc.items and acc.is_prefix_of(prompt):
            stats.merged_calls += 1
            acc.context(prompt[len(acc.items) :], opaque, sequence_id)
        else:
            if acc.items:
                sequences.append(acc)
                acc = _Accumulator()
            acc.context(prompt, opaque, sequence_id)
        trained = call_id not in message_ids
        if not trained:
            stats.message_masked_tokens += len(sampled)
        acc.action(sampled, interaction.logprobs, advantage, trained, call_id in error_ids, sequence_id)
        acc.routing = _routing_handle(interaction.routing_id)
    if acc.items:
        sequences.append(acc)

    datums: list[tinker.Datum] = []
    for index, sequence in enumerate(sequences):
        extra: dict[str, tuple[list[Any], Dtype]] = {
            "checkpoint_version": ([int(checkpoint_version)], "int64")
        }
        if depth is not None:
            extra["traj_depth"] = ([int(depth)], "int64")
            extra["traj_start"] = ([1.0 if index == 0 else 0.0], "float32")
        datum = sequence.datum(extra)
        stats.tokens_after_merge += datum.model_input.length + 1
        datums.append(datum)
    stats.postmerge_datums += len(datums)
    return datums


# --------------------------------------------------------------------------------------------------------------
# Datum-level helpers


def _data(datum: tinker.Datum, key: str) -> list[float]:
    tensor = datum.loss_fn_inputs.get(key)
    return [] if tensor is None else [float(x) for x in tensor.data]


def _action_tokens(datum: tinker.Datum) -> int:
    """The positions that train (mask > 0), counted on the SDK's array: no list of floats per position."""
    import numpy as np

    tensor = datum.loss_fn_inputs.get("mask")
    return 0 if tensor is None else int(np.count_nonzero(tensor.to_numpy() > 0))


def _replace(
    datum: tinker.Datum, updates: Mapping[str, Any], drop: Iterable[str] = (), *, provenance: bool = True
) -> tinker.Datum:
    from tinker import TensorData

    inputs = {k: v for k, v in datum.loss_fn_inputs.items() if k not in set(drop)}
    for key, (data, dtype) in updates.items():
        inputs[key] = TensorData(data=list(data), dtype=dtype, shape=[len(data)])
    return with_loss_inputs(datum, inputs, provenance=provenance)


def filter_error_tokens(
    datums: Sequence[tinker.Datum], stats: DatumStats | None = None
) -> list[tinker.Datum]:
    """Consume the private error mask, sign-aware: flagged action tokens whose final advantage is > 0
    get mask 0 and advantage 0; those with advantage <= 0 keep training. Datums left without action tokens go."""
    stats = stats if stats is not None else DatumStats()
    out: list[tinker.Datum] = []
    for datum in datums:
        if ERROR_MASK not in datum.loss_fn_inputs:
            out.append(datum)
            continue
        errors = _data(datum, ERROR_MASK)
        mask = _data(datum, "mask")
        advantages = _data(datum, "advantages")
        had_actions = any(m > 0 for m in mask)
        for i, flagged in enumerate(errors):
            if not flagged or mask[i] <= 0:
                continue
            stats.error_detected_action_tokens += 1
            if advantages[i] > 0:
                stats.error_suppressed_positive_action_tokens += 1
                mask[i] = 0.0
                advantages[i] = 0.0
            else:
                stats.error_retained_nonpositive_action_tokens += 1
        if had_actions and not any(m > 0 for m in mask):
            stats.error_emptied_datums += 1
            continue
        updates = {"mask": (mask, "float32"), "advantages": (advantages, "float32")}
        out.append(_replace(datum, updates, drop=(ERROR_MASK,)))
    return out


def keep_subagent_datum(
    probability: float, *, seed: int, task_id: str, trajectory_id: str, depth: int, datum_index: int
) -> bool:
    """The deterministic Bernoulli draw of subagent datum sampling."""
    if probability >= 1.0:
        return True
    if probability <= 0.0:
        return False
    key = f"{seed}\0{task_id}\0{trajectory_id}\0{depth}\0{datum_index}".encode()
    draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return draw < math.floor(probability * 2**64)


def _mark_start(datums: list[tinker.Datum]) -> list[tinker.Datum]:
    # traj_start belongs on the first retained datum that trains anything: depth weighting counts trajectories by it.
    marked = False
    out = []
    for datum in datums:
        start = 1.0 if not marked and _action_tokens(datum) > 0 else 0.0
        marked = marked or start > 0
        out.append(_replace(datum, {"traj_start": ([start], "float32")}))
    return out


# --------------------------------------------------------------------------------------------------------------
# A collection and a group


def collection_datums(
    collection: TrajectoryCollection,
    interactions: Mapping[str, Interaction],
    advantages: Mapping[str, float],
    *,
    checkpoint_version: int = 0,
    depth_tags: bool = False,
    filter_errors: bool = True,
    filter_message_actions: bool = False,
    subagent_datum_keep_probability: float = 1.0,
    subagent_datum_sampling_seed: int = 0,
) -> DatumBatch:
    """The datums of one rollout: every converted trajectory is merged into datums (for the stats);
    trajectories absent from `advantages` (policy-ineligible) lose theirs; non-root datums are Bernoulli-sampled;
    error tokens are filtered by the sign of their (final) advantage; datums without action tokens are dropped.

    `advantages` maps trajectory id -> its centered advantage (`MemberCredit.advantages`). `depth_tags` keeps
    `traj_depth`/`traj_start` for depth weighting; without it they are not added.
    """
    batch = DatumBatch()
    stats = batch.stats
    root = collection.root
    depths = trajectory_depths(collection)
    task_id = "" if root is None or root.task is None or root.task.id is None else str(root.task.id)
    p = float(subagent_datum_keep_probability)
    sampling: dict[str, float] = {}
    if p < 1.0:  # the totals are logged even when no subagent datum was eligible
        sampling = {
            f"subagent_sampling/{kind}_{name}": 0.0
            for kind in ("eligible", "retained")
            for name in _SIZE_NAMES
        }
    for tid, trajectory in collection.trajectories.items():
        if is_skipped(trajectory):
            stats.skipped_trajectories += 1
            continue
        stats.trajectories += 1
        depth = depths[tid]
        eligible = tid in advantages
        errors = error_completion_ids(trajectory) if filter_errors and eligible else set()
        messages = message_completion_ids(trajectory) if filter_message_actions and eligible else set()
        datums = trajectory_datums(
            trajectory,
            interactions,
            float(advantages.get(tid, 0.0)),
            checkpoint_version=checkpoint_version,
            depth=depth if depth_tags else None,  # without depth weighting the datums never carry the tags
            error_ids=errors,
            message_ids=messages,
            stats=stats,
        )
        if not eligible:
            stats.policy_excluded_trajectories += 1
            stats.policy_excluded_datums += len(datums)
            continue
        stats.policy_eligible_datums += len(datums)
        if trajectory is not root and p < 1.0:
            kept = []
            for index, datum in enumerate(datums):
                keep = keep_subagent_datum(
                    p,
                    seed=subagent_datum_sampling_seed,
                    task_id=task_id,
                    trajectory_id=tid,
                    depth=depth,
                    datum_index=index,
                )
                for kind in ("eligible", "retained") if keep else ("eligible",):
                    for name, value in _sizes(datum).items():
                        for scope in (f"depth_{depth}/", ""):
                            metric = f"subagent_sampling/{scope}{kind}_{name}"
                            sampling[metric] = sampling.get(metric, 0.0) + value
                if keep:
                    kept.append(datum)
            datums = kept
        stats.post_sampling_datums += len(datums)
        datums = filter_error_tokens(datums, stats)
        trained = [datum for datum in datums if _action_tokens(datum) > 0]
        stats.empty_datums += len(datums) - len(trained)
        if depth_tags:
            trained = _mark_start(trained)
        stats.retained_datums += len(trained)
        batch.datums.extend(trained)
    batch.metrics = {**stats.as_metrics(), **sampling}
    return batch


def group_datums(
    result: GroupResult,
    interactions: Sequence[Mapping[str, Interaction] | None],
    *,
    checkpoint_version: int | Sequence[int] = 0,
    filter_errors: bool = True,
    filter_message_actions: bool = False,
    subagent_datum_keep_probability: float = 1.0,
    subagent_datum_sampling_seed: int = 0,
) -> DatumBatch:
    """The datums of a group from its credit (`group_advantages`) and each member's interaction map (in member
    order). A rejected group gives none; `checkpoint_version` may be one per member."""
    members = result.members
    if len(interactions) != len(members):
        raise ValueError(f"{len(interactions)} interaction maps for {len(members)} group members")
    versions = (
        [int(checkpoint_version)] * len(members)
        if isinstance(checkpoint_version, int)
        else [int(v) for v in checkpoint_version]
    )
    batch = DatumBatch(metrics=dict(result.metrics))
    if result.rejection is not None:
        batch.metrics.update(batch.stats.as_metrics())
        return batch
    sampling: dict[str, float] = {}
    for member, calls, version in zip(members, interactions, versions, strict=True):
        if member.collection is None or calls is None:
            continue
        part = collection_datums(
            member.collection,
            calls,
            member.advantages,
            checkpoint_version=version,
            depth_tags=result.depth_tags,
            filter_errors=filter_errors,
            filter_message_actions=filter_message_actions,
            subagent_datum_keep_probability=subagent_datum_keep_probability,
            subagent_datum_sampling_seed=subagent_datum_sampling_seed,
        )
        batch.datums.extend(part.datums)
        batch.stats.add(part.stats)
        for key, value in part.metrics.items():
            if key.startswith("subagent_sampling/"):
                sampling[key] = sampling.get(key, 0.0) + value
    batch.metrics.update(batch.stats.as_metrics())
    batch.metrics.update(sampling)
    return batch


# --------------------------------------------------------------------------------------------------------------
# Per microbatch


def zero_objective(loss_fn: str, loss_fn_config: Mapping[str, Any] | None) -> bool:
    """Whether the loss is exactly zero for zero advantages: `cispo`, `ppo` or `importance_sampling` with a config
    holding only the clip thresholds."""
    return loss_fn in ZERO_OBJECTIVE_LOSSES and set(loss_fn_config or {}) <= _CLIP_KEYS


def _represented(datum: tinker.Datum) -> float:
    count = _data(datum, LOSS_TOKEN_COUNT)
    return count[0] if count else float(sum(_data(datum, "mask")))


def filter_zero_advantage_datums(
    datums: Sequence[tinker.Datum],
    *,
    enabled: bool = True,
    loss_fn: str = "cispo",
    loss_fn_config: Mapping[str, Any] | None = None,
) -> tuple[list[tinker.Datum], dict[str, float]]:
    """Drop datums whose action-token advantages are all exactly 0, only when `enabled` and
    the loss is a zero-objective one. The dropped action-token mass rides on the first retained datum (a private
    count), so the per-token normalization is unchanged."""
    datums = list(datums)
    if not enabled or not zero_objective(loss_fn, loss_fn_config):
        return datums, {}
    kept: list[tinker.Datum] = []
    dropped_mass = 0.0
    totals = {f"{k}_{n}": 0.0 for k in ("eligible", "retained", "filtered") for n in _SIZE_NAMES}
    for datum in datums:
        mask = _data(datum, "mask")
        advantages = _data(datum, "advantages")
        zero = all(a == 0.0 for a, m in zip(advantages, mask, strict=True) if m > 0)
        kind = "filtered" if zero else "retained"
        for name, value in _sizes(datum).items():
            totals[f"eligible_{name}"] += value
            totals[f"{kind}_{name}"] += value
        if zero:
            dropped_mass += _represented(datum)
        else:
            kept.append(datum)
    if kept and dropped_mass:
        first = kept[0]
        kept[0] = _replace(first, {LOSS_TOKEN_COUNT: ([_represented(first) + dropped_mass], "float32")})
    return kept, {f"zero_advantage_filter/{k}": v for k, v in totals.items()}


_SIZE_NAMES = ("datums", "attention_tokens", "loss_tokens")


def _sizes(datum: tinker.Datum) -> dict[str, float]:
    return {
        "datums": 1.0,
        "attention_tokens": float(datum.model_input.length),
        "loss_tokens": float(_action_tokens(datum)),
    }


def loss_datums(datums: Sequence[tinker.Datum], loss_fn: str = "cispo") -> list[tinker.Datum]:
    """What `forward_backward` is sent: private keys stripped, advantages divided by the
    represented action-token count of the microbatch (+1e-8) so the service's summed loss is a per-token mean.
    Under gspo the sequence ratio is taken over the action tokens (`sequence_ratio_mask`): prompt positions carry no
    sampling logprob. Only a loss that reads provenance (stable_reinforce) is sent it."""
    represented = math.fsum(_represented(datum) for datum in datums)
    scale = 1.0 / (represented + 1e-8)
    out = []
    for datum in datums:
        updates: dict[str, tuple[list[float], str]] = {
            "advantages": ([a * scale for a in _data(datum, "advantages")], "float32")
        }
        if loss_fn == "gspo":
            updates["sequence_ratio_mask"] = (
                [1.0 if m > 0 else 0.0 for m in _data(datum, "mask")],
                "float32",
            )
        out.append(_replace(datum, updates, drop=PRIVATE_KEYS, provenance=loss_fn in PROVENANCE_LOSSES))
    return out
