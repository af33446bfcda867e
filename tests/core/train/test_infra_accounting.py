"""Infrastructure failures you can see, on the embedded local server with the real Tinker SDK: each step counts them
per label (`infra_failed_rate`, and the count of each kind) in `metrics.jsonl` and on its line; the datums the service
receives never hold one of them (checked on the datums themselves); and a run whose rollouts keep failing in the
infrastructure (over `train.max_infra_failure_rate` across 5 steps) stops with one line naming the most frequent
kind, keeping what trained.

Two entries, `alpha` and `beta`, of one task each. The environment's grader raises when the answer is `X` (an `env_error`); the harness raises for some rollouts (a
`harness_crash`). Every rollout that will fail says `doomed` in its prompt, so a datum of one is visible in its tokens.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
BANDIT = REPO / "examples" / "bandit" / "train.yaml"

ENV_MODULE = textwrap.dedent(
    '''
    from openreward.environments import Environment, TextBlock, ToolOutput, tool
    from pydantic import BaseModel


    class Answer(BaseModel):
        letter: str


    class Family(Environment):
        family = "FAMILY"

        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": cls.family, "goal": f"Answer with one letter ({cls.family})."}]

        def get_prompt(self):
            return [TextBlock(text=self.task_spec["goal"])]

        @tool
        def answer(self, params: Answer) -> ToolOutput:
            """Submit the answer."""
            if params.letter == "X":
                raise ConnectionError("grader unreachable")
            reward = 1.0 if params.letter == "C" else 0.0
            return ToolOutput(blocks=[TextBlock(text="graded")], reward=reward, finished=True)

    '''
)

HARNESS = "test-infra-accounting"
_started = {"alpha": 0, "beta": 0}  # rollouts started so far, per family


def _plan(family: str, number: int) -> str:
    """What the family's rollout `number` does: `crash` (the harness raises), `X` (the grader raises), or answer.

    Steps 1-3 (a family's rollouts 1-12): one of each group's 4 fails (alpha: the harness; beta: the grader), the
    others answer C, A, C, so the group trains. From step 4 on, 3 of 4 fail and the last answers A alone (under
    `min_successful_group_size: 2`): 75 % of a step's rollouts, so the 5-step window passes 50 % at step 6, not
    before.
    """
    step, position = (number - 1) // 4 + 1, (number - 1) % 4
    if step <= 3:
        if position == 0:
            return "crash" if family == "alpha" else "X"
        return "C" if position % 2 else "A"
    if position == 3:
        return "A"
    return "crash" if family == "alpha" and position == 0 else "X"


@harness(HARNESS)
async def _failing_in_the_infrastructure(ctx: Any) -> AgentResult:
    family = "alpha" if "(alpha)" in ctx.instruction else "beta"
    _started[family] += 1
    plan = _plan(family, _started[family])
    fate = "fine" if plan in ("A", "C") else "doomed"
    reply = await ctx.chat([{"role": "user", "content": f"{ctx.instruction} {fate}"}], max_tokens=1)
    if plan == "crash":
        raise RuntimeError("the harness lost its sandbox")
    try:
        await ctx.call_tool("answer", {"letter": plan})
    except Exception:  # the grader crashed: the harness ends as a harness would, the environment says why
        pass
    return AgentResult(final_message=reply.text)


@pytest.fixture
def sent_datums(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Every list of datums the trainer sends to `forward_backward` (the real SDK call still runs)."""
    import tinker

    calls: list[list[Any]] = []
    original = tinker.TrainingClient.forward_backward

    def spy(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(list(data))
        return original(self, data, *args, **kwargs)

    monkeypatch.setattr(tinker.TrainingClient, "forward_backward", spy)
    return calls


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.guarantee(
    "Most rollouts of 5 steps fail in the infrastructure (a grader raises, a harness crashes)",
    "two ORS entries, training",
    "no datum of a failed rollout reaches the service; counted per label and kind; past `train.max_infra_failure_rate` the run stops with one line naming the most frequent kind, exit 1",
)
def test_infra_failures_are_counted_per_label_never_trained_and_stop_a_run_they_overwhelm(
    tmp_path, monkeypatch, capsys, sent_datums
):
    from platoon.renderers.toy import toy_tokenizer

    harness(HARNESS)(_failing_in_the_infrastructure)  # again: another test may have cleared the registry
    _started.update(alpha=0, beta=0)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    for family in ("alpha", "beta"):  # a module each: one module's environments share its tasks
        (tmp_path / f"{family}_env.py").write_text(ENV_MODULE.replace("FAMILY", family))
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [
        "train",
        str(BANDIT),
        f"log_path={tmp_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.max_training_steps=10",
        "train.max_staleness=0",
        # a group left with one scored member is dropped whole, never made up with zeros
        "train.workflow_config.min_successful_group_size=2",
        "checkpoint.every=0",
        # two entries, so each step's metrics are also per label (an entry's name is its label), interleaved so
        # that each step draws one task of each
        "train.task_order=weighted",
        "environments=["
        f"{{name: alpha, service: 'python://alpha_env:Family', harness: {HARNESS}}}, "
        f"{{name: beta, service: 'python://beta_env:Family', harness: {HARNESS}}}]",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err
    said = [
        line for line in err.splitlines() if line.startswith(("platoon: step ", "platoon: training stopped"))
    ]
    # each step's line says how many rollouts failed in the infrastructure, and of which kinds
    assert "; 2 of 8 rollouts failed in the infrastructure (env_error 1, harness_crash 1); " in said[0]
    assert "; 6 of 8 rollouts failed in the infrastructure (env_error 5, harness_crash 1); " in said[3]
    # 45 % over steps 1..5 goes on; 55 % over steps 2..6 stops, naming the kind most of them were
    assert said[-1] == (
        "platoon: training stopped at step 6: 22 of the 40 rollouts of steps 2..6 failed in the infrastructure "
        "(55%, over train.max_infra_failure_rate 0.5); the most frequent kind: env_error (17 of 22); fix that, "
        "then the same command resumes"
    )
    assert len(said) == 7

    run = tmp_path / "bandit" / "run"
    steps = [row for row in _rows(run / "metrics.jsonl") if "train/step" in row]
    assert [row["step"] for row in steps] == [1, 2, 3, 4, 5, 6]

    def infra(row: dict[str, Any], prefix: str) -> tuple[float, float, float]:
        return (
            row[f"{prefix}/infra_failed_rate"],
            row[f"{prefix}/infra_failed/env_error"],
            row[f"{prefix}/infra_failed/harness_crash"],
        )

    assert [infra(row, "train/batch") for row in steps] == [(0.25, 1.0, 1.0)] * 3 + [(0.75, 5.0, 1.0)] * 3
    assert [infra(row, "train/batch/environment/alpha") for row in steps] == [(0.25, 0.0, 1.0)] * 3 + [
        (0.75, 2.0, 1.0)
    ] * 3
    assert [infra(row, "train/batch/environment/beta") for row in steps] == [(0.25, 1.0, 0.0)] * 3 + [
        (0.75, 3.0, 0.0)
    ] * 3

    # The datums themselves: none of a rollout that failed, every one of a rollout that answered in steps 1-3 (three
    # per group); from step 4 a group's lone answer leaves it under its minimum size: dropped, nothing is sent.
    tokenizer = toy_tokenizer()
    prompts = [tokenizer.decode(datum.model_input.to_ints()) for call in sent_datums for datum in call]
    assert not [text for text in prompts if "doomed" in text]
    assert len(prompts) == 3 * 2 * 3 and all("fine" in text for text in prompts)

    # What trained is kept: the run resumes after step 6.
    checkpoints = _rows(run / "checkpoints.jsonl")
    assert [(row["name"], row["batch"]) for row in checkpoints] == [
        ("recovery-000000", 0),
        ("000006_interrupted", 6),
    ]
    assert [row["train/group_size_rejected"] for row in steps] == [0.0] * 3 + [2.0] * 3
    # the attempt log: each group of steps 1-6 consumed once, trained while it had enough scored members
    attempts = _rows(run / "attempts.jsonl")
    consumed = [
        (row["step"], row["state"], row.get("reason")) for row in attempts if row["state"] != "started"
    ]
    assert sorted(consumed) == [(step, "trained", None) for step in (1, 1, 2, 2, 3, 3)] + [
        (step, "dropped", "group_size_rejected") for step in (4, 4, 5, 5, 6, 6)
    ]


def test_max_infra_failure_rate_out_of_range_is_refused_by_validate_naming_the_key(tmp_path, capsys):
    config = tmp_path / "train.yaml"
    config.write_text(
        BANDIT.read_text().replace("  batch_size: 8\n", "  batch_size: 8\n  max_infra_failure_rate: 1.5\n")
    )
    assert main(["config", "validate", "--no-resolve", str(config)]) == 78
    out = capsys.readouterr().out
    assert "train.max_infra_failure_rate: Input should be less than or equal to 1 (got 1.5)" in out
