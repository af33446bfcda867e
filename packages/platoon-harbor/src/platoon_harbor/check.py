"""The dataset check (`platoon harbor check CONFIG`, also the `check` step of `platoon prepare`): every task of a
Harbor entry runs once with `platoon-oracle` and once with `platoon-noop` through the rollout path `platoon rollout`
uses (core's `run_member`), in the entry's own sandboxes, and a task whose oracle does not reach the reward's maximum
or whose noop scores above its minimum is quarantined with its reason.

Verdicts go to a check file beside the dataset's lock (`<lock>.check.json`; a directory-backed entry has no lock,
so `<harbor cache>/checks/<digest of its paths>.check.json`), keyed by task id and each task's content digest, so an
edited task has no verdict until it is checked again. Runs read it through `harbor_check` (`required | warn | off`):
the listing skips quarantined tasks, and `required` refuses to start while a task has no verdict. The file and the
mode are `platoon_harbor.check_file`'s.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import platoon
from platoon.config import EnvironmentConfig, RolloutConfig
from platoon.errors import ConfigError
from platoon.gateway import ModelGateway
from platoon.rollouts.one_rollout import MemberRequest, run_member
from platoon_harbor.check_file import task_digests
from platoon_harbor.service import HarborService

__all__ = ["TaskVerdict", "check_entry", "judge"]

ORACLE, NOOP = "platoon-oracle", "platoon-noop"
#: how much of the verifier's output a reason keeps (the end, where the failure is)
REASON_OUTPUT_CHARS = 300
DEFAULT_CONCURRENCY = 4


# -- running the check -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskVerdict:
    """One task's check: each harness's result, the seconds both took, the verdict and its reason."""

    task: str
    digest: str
    oracle: str
    noop: str
    seconds: float
    reason: str | None = None

    @property
    def verdict(self) -> str:
        return "ok" if self.reason is None else "quarantined"

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "digest": self.digest,
            "verdict": self.verdict,
            "oracle": self.oracle,
            "noop": self.noop,
            "seconds": round(self.seconds, 2),
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def _one_line(text: str, limit: int = REASON_OUTPUT_CHARS) -> str:
    """The text on one line, its control characters (a task's output may hold terminal escapes) shown as `?`."""
    flat = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return flat if len(flat) <= limit else "..." + flat[-limit:]


def _output_tail(outcome: Any) -> str:
    """The verifier's output the outcome kept (its longest `*output*` metadata text), as one line."""
    metadata = getattr(outcome, "metadata", None) or {}
    texts = [v for k, v in metadata.items() if "output" in k and isinstance(v, str) and v.strip()]
    return _one_line(max(texts, key=len)) if texts else ""


def _with_output(reason: str, outcome: Any) -> str:
    tail = _output_tail(outcome)
    return f"{reason}: verifier output: {tail}" if tail else reason


def _cell(outcome: Any) -> str:
    """A harness's result for the table: the reward, else the status and failure kind."""
    if outcome is None:
        return "no outcome"
    if outcome.status == "scored":
        return f"{outcome.reward:g}"
    return f"{outcome.status}:{outcome.failure_kind}" if outcome.failure_kind else str(outcome.status)


def _not_scored(harness: str, outcome: Any, error: str | None) -> str:
    if outcome is None:
        return f"{harness} produced no outcome: {error or 'the rollout failed'}"
    kind = f" ({outcome.failure_kind})" if outcome.failure_kind else ""
    return (
        f"{harness} was not scored: {outcome.status}{kind}: {_one_line(outcome.reason or 'no reason given')}"
    )


def judge(
    oracle: Any, noop: Any, bounds: tuple[float, float], errors: Mapping[str, str | None]
) -> str | None:
    """Why a task is quarantined, or None: the oracle must score the maximum, the noop at most the minimum."""
    low, high = bounds
    if oracle is None or oracle.status != "scored":
        return _with_output(_not_scored("oracle", oracle, errors.get(ORACLE)), oracle)
    if oracle.reward < high:
        return _with_output(
            f"oracle scored {oracle.reward:g} (max {high:g}): its solution does not pass", oracle
        )
    if noop is None or noop.status != "scored":
        return _with_output(
            _not_scored("noop", noop, errors.get(NOOP))
            + " (an agent that does nothing must score the minimum)",
            noop,
        )
    if noop.reward > low:
        return f"noop scored {noop.reward:g} (min {low:g}): the tests pass without the agent doing anything"
    return None


class _NoModel:
    """The renderer of the check's gateway, which has no sampler: platoon-oracle and platoon-noop never call the
    model, so nothing is rendered (and no tokenizer is loaded)."""

    tokenizer = None

    def stop_token_ids(self) -> list[int]:
        return []

    def render_prompt(self, messages: Any, tools: Any = None) -> list[int]:
        raise RuntimeError("the dataset check's harnesses (platoon-oracle, platoon-noop) make no model calls")


def _check_gateway() -> Any:
    return ModelGateway(None, _NoModel(), model_name="platoon-check")


def _need_harnesses() -> None:
    """Both harnesses resolve, or one line naming what to install (every task would fail the same way)."""
    for name in (ORACLE, NOOP):
        try:
            platoon.get_harness(name)
        except ValueError as exc:
            raise ConfigError(f"the dataset check runs {name}, which does not resolve here: {exc}") from None


def _recording_service(options: Mapping[str, Any]) -> Any:
    """The entry's Harbor service (quarantines not applied: every task is checked), keeping each session's full
    outcome: the trajectory keeps only its status, rewards and reason, and a reason needs the verifier's output."""

    class RecordingService(HarborService):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.graded: dict[str, Any] = {}

        async def open(self, task: Any, **kwargs: Any) -> Any:
            session = await super().open(task, **kwargs)
            grade = session.grade

            async def graded() -> Any:
                outcome = await grade()
                self.graded[str(task.id)] = outcome
                return outcome

            session.grade = graded  # type: ignore[method-assign]  # this session only
            return session

    return RecordingService(**{**options, "harbor_check": "off"})


async def _run_harness(
    harness: str, options: Mapping[str, Any], service: Any, gateway: Any, task_id: str, scratch: str
) -> tuple[Any, str | None, float]:
    """One rollout of `task_id` with `harness` through `run_member`: (the graded outcome or None, error, seconds)."""
    entry = EnvironmentConfig(service="harbor", service_kwargs=dict(options), harness=harness)
    task = await service.get_task(task_id)
    config = RolloutConfig(model_name="platoon-check", return_dict=True, verbose=False, output_dir=scratch)
    request = MemberRequest(
        task=task,
        task_id=task_id,
        label=harness,
        entry=entry,
        split="check",
        rollout_number=0,
        rollout_config=config,
    )
    outcome = await run_member(request, service=service, gateway=gateway, version=lambda: 0)
    return service.graded.get(task_id), outcome.error, outcome.seconds


async def check_entry(
    options: Mapping[str, Any],
    *,
    only: Callable[[str], bool] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
    progress: Callable[[TaskVerdict, int, int], None] | None = None,
) -> list[TaskVerdict]:
    """Check the tasks (those `only` accepts) of the entry whose `service_kwargs` are `options`: oracle and noop
    for each, in the entry's sandboxes with its grading, `concurrency` tasks at a time."""
    _need_harnesses()
    oracle_service = _recording_service(options)
    noop_service = _recording_service(options)
    tasks = await asyncio.to_thread(oracle_service._discover)
    digests = await asyncio.to_thread(task_digests, tasks, fetched=oracle_service.options.fetched)
    bounds = oracle_service.options.reward.range or (0.0, 1.0)
    wanted = [task_id for task_id in tasks if only is None or only(task_id)]
    gateway = _check_gateway()
    gate = asyncio.Semaphore(max(1, concurrency))
    verdicts: list[TaskVerdict] = []

    with tempfile.TemporaryDirectory(prefix="platoon-check-") as scratch:

        async def one(task_id: str) -> TaskVerdict:
            async with gate:
                started = time.monotonic()
                (oracle, oracle_error, _), (noop, noop_error, _) = await asyncio.gather(
                    _run_harness(ORACLE, options, oracle_service, gateway, task_id, scratch),
                    _run_harness(NOOP, options, noop_service, gateway, task_id, scratch),
                )
                verdict = TaskVerdict(
                    task_id,
                    digests[task_id],
                    _cell(oracle),
                    _cell(noop),
                    time.monotonic() - started,
                    judge(oracle, noop, bounds, {ORACLE: oracle_error, NOOP: noop_error}),
                )
            verdicts.append(verdict)
            if progress is not None:
                progress(verdict, len(verdicts), len(wanted))
            return verdict

        ordered = await asyncio.gather(*(one(task_id) for task_id in wanted))
    return list(ordered)
