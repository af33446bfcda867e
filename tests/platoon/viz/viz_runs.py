"""Real number-search rollouts for the viewer's tests and screenshots (scripts/viz_screenshots.py imports this):
each runs through `platoon.testing.run_episode` (the real harness, environment, gateway and trajectory build) with
a scripted binary-search policy, and its event file is written by `write_events`, as `platoon rollout` and
`platoon eval` write theirs.

Three rollouts: platoon-codeact (steps with code and output), platoon-react (tool calls), and a tree — a root that
spawns a subagent, plays by tool calls, then spawns a verifier — for forks and verifier placement.
"""

from __future__ import annotations

from pathlib import Path

import platoon as pt
from platoon.envs.number_search import REACT_SYSTEM_PROMPT, SERVICE
from platoon.harness.agent import AgentResult
from platoon.testing import last_user_message
from platoon.testing.episode import run_episode
from platoon.testing.number_search import codeact_guesses, open_range, react_binary_search
from platoon.trajectory_events import write_events

CODEACT_OPTIONS = {
    "prompt_builder": "platoon.envs.number_search.prompts:NumberSearchPromptBuilder",
    "include_reasoning": True,
    "subagents": False,
}
TREE_HARNESS = "viz-test-tree"


def codeact_policy(prompt: str) -> str:
    low, high = open_range(prompt, codeact_guesses(prompt))
    number = (low + high) // 2
    return f"<thought>\nHalve the range: try {number}.\n</thought>\n<python>\nguess({number})\n"


def react_policy(prompt: str) -> str:
    if last_user_message(prompt).startswith("Suggest"):
        return "Start in the middle of the range."
    if last_user_message(prompt).startswith("Check"):
        return "The search halved the range each turn and ended on the number: correct."
    return react_binary_search(prompt)


@pt.harness(TREE_HARNESS)
async def tree_harness(ctx: pt.AgentContext) -> AgentResult:
    """A subagent first, the search by tool calls (platoon-react), then a verifier of the root's work."""
    from platoon_harnesses.react import react

    if ctx.depth > 0:
        reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
        return AgentResult(final_message=reply.text)
    await ctx.agents.spawn("Suggest a first guess for this range.", max_steps=1)
    result = await react(ctx)
    await ctx.agents.spawn("Check that the search found the number.", max_steps=1, role="verifier")
    return result


def codeact_run(output_dir: Path, task: str = "train:3") -> Path:
    run = run_episode(
        task,
        service=SERVICE,
        harness="platoon-codeact",
        policy=codeact_policy,
        harness_options=CODEACT_OPTIONS,
        output_dir=output_dir,
    )
    return write_events(run.collection, output_dir, task_id=task)


def react_run(output_dir: Path, task: str = "train:0") -> Path:
    run = run_episode(
        task,
        service=SERVICE,
        harness="platoon-react",
        policy=react_policy,
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
        output_dir=output_dir,
    )
    return write_events(run.collection, output_dir, task_id=task)


def tree_run(output_dir: Path, task: str = "val:0") -> Path:
    run = run_episode(
        task,
        service=SERVICE,
        # The function itself, not its name: tests that reset the harness registry may have run since this
        # module registered it, and handing the function over registers it again.
        harness=tree_harness,
        policy=react_policy,
        harness_options={"system_prompt": REACT_SYSTEM_PROMPT},
        agents={"max_depth": 1},
        max_steps=20,
        output_dir=output_dir,
    )
    # The tests read a root, a child and a verifier: say why if the run made fewer.
    made = len(run.collection.trajectories)
    assert made == 3, (made, run.outcome, run.root.error_message, run.root.finish_message)
    return write_events(run.collection, output_dir, task_id=task)


# ---------------------------------------------------------------------------------------------------------------
# A small training run: `platoon train` on the local Tinker-compatible server, whose event files are written by
# the trainer itself (one file per policy version, every record saying its step, policy version and label).

BANDIT = Path(__file__).resolve().parents[3] / "examples" / "bandit" / "train.yaml"
SCRIPTED_BANDIT = "viz-test-scripted-bandit"
#: what the members of each group answer, in the order they start: right, wrong, a crash (an `error` outcome),
#: right. Every group scores alike (2 of 3 scored), so every step trains and moves the policy version on.
SCRIPT = ("C", "A", None, "C")
_started: dict[str, int] = {}


@pt.harness(SCRIPTED_BANDIT)
async def scripted_bandit(ctx: pt.AgentContext) -> AgentResult:
    """The bandit's own harness (one model call, its tokens trained on), with the answer taken from `SCRIPT`."""
    task = str(ctx.task.id)
    member = _started.get(task, 0)
    _started[task] = member + 1
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    letter = SCRIPT[member % len(SCRIPT)]
    if letter is None:
        raise RuntimeError("the scripted member crashes")
    await ctx.call_tool("answer", {"letter": letter})
    return AgentResult(final_message=f"{reply.text} -> {letter}")


def bandit_rollout(task: str, letter: str | None, output_dir: Path) -> pt.TrajectoryCollection:
    """One real bandit rollout (its environment and harness) whose policy answers `letter`; None crashes the
    harness instead (an `error` outcome)."""
    from platoon.envs.bandit import HARNESS, SERVICE

    if letter is None:
        return run_episode(task, service=SERVICE, harness=crashing_bandit, output_dir=output_dir).collection
    return run_episode(
        task, service=SERVICE, harness=HARNESS, policy=[letter], output_dir=output_dir
    ).collection


@pt.harness("viz-test-crashing-bandit")
async def crashing_bandit(ctx: pt.AgentContext) -> AgentResult:
    raise RuntimeError("the scripted member crashes")


def training_layout(run_dir: Path, steps: int = 4) -> Path:
    """A training run's `rollouts/` as the trainer leaves it, without training: real bandit rollouts (groups of
    four answering after `SCRIPT`), appended by the trainer's writer (`append_events`) with the context it gives
    (scope, step, policy version, the `label_by=order` label) to the files of its layout: each step sampled the
    policy the step before it trained, and an evaluation ran after step 2. Returns `run_dir`."""
    from platoon.trajectory_events import append_events, scope_event_file

    made = 0

    def rollout(task: str, letter: str | None) -> pt.TrajectoryCollection:
        nonlocal made
        made += 1
        return bandit_rollout(task, letter, run_dir / "episodes" / str(made))

    for step in range(1, steps + 1):
        version = step - 1
        events = scope_event_file(run_dir / "rollouts" / "train" / str(version), "train", version)
        for slot in range(2):
            task = f"train:{(2 * step + slot) % 24}"
            for letter in SCRIPT:
                collection = rollout(task, letter)
                order = collection.root.task.misc["order"]
                context = {"scope": "train", "training_step": step, "policy_version": version, "label": order}
                append_events(collection, events, context=context)
        if step == 2:
            evaluation = scope_event_file(run_dir / "rollouts" / "eval" / "step_2", "eval", 2)
            for task in ("val:0", "val:1"):
                append_events(rollout(task, "C"), evaluation, context={"scope": "eval", "training_step": 2})
    return run_dir


def training_run(log_path: Path, steps: int = 3) -> Path:
    """Train the bandit for `steps` steps of two groups of four, labelled by the order the task lists the letters
    in (`train.label_by`), each step waiting for the last one's update (so each samples a new policy version), with
    an evaluation after step 2; returns the run directory."""
    from platoon.cli import main

    _started.clear()
    argv = [
        "train",
        str(BANDIT),
        f"log_path={log_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        f"train.max_training_steps={steps}",
        "train.max_staleness=0",
        "train.label_by=order",
        f"environments=[{{env: platoon-bandit, harness: {SCRIPTED_BANDIT}}}]",
        "eval.every=2",
    ]
    # The function itself, not its name, is registered again: tests that reset the registry may have run.
    pt.harness(SCRIPTED_BANDIT)(scripted_bandit)
    status = main(argv)
    assert status == 0, f"platoon {' '.join(argv)} exited {status}"
    return log_path / "bandit" / "run"
