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
