"""`platoon-codeact`: the model writes Python cells that call the environment's tools as functions.

Options (checked by `CodeActOptions`), the step loop, loop detection and the prompt modes are this module's; prompts
come from a `CodeActPromptBuilder` (platoon-core's contract) and cells run in `executor.CodeActExecutor`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from platoon.config import resolve_import_string
from platoon.harness.agent import LIMIT_MESSAGE, AgentContext, AgentResult, final_answer_tool, out_of_steps
from platoon.harness.codeact import PROMPT_MODES, CellFunction, CodeActCell, CodeActPromptBuilder
from platoon.harness.function import harness
from platoon.hookspecs import PrepareStep
from platoon_harnesses.codeact.checks import CellChecks, stuck_in_loop
from platoon_harnesses.codeact.executor import CodeActExecutor

#: the message of an agent ended by loop detection
STUCK_MESSAGE = "Stuck in a loop, terminating early."

OPTIONS = (
    "prompt_builder",
    "prompt_builder_options",
    "prompt_mode",
    "include_reasoning",
    "sampling",
    "cell_timeout_s",
    "max_output_chars",
    "subagents",
    "subagent_budget",
    "checks",
)
CHECKS = (
    "unawaited_async_calls",
    "while_loops",
    "interactive_input",
    "stuck_in_loop_threshold",
    "stuck_in_loop_window",
)
SUBAGENT_BUDGETS = ("argument", "fixed")


class CodeActOptionError(ValueError):
    """A `harness_options` value platoon-codeact refuses; the message names the option."""


@dataclass(frozen=True)
class CodeActOptions:
    """platoon-codeact's options with their defaults."""

    prompt_builder: type[CodeActPromptBuilder] = CodeActPromptBuilder
    prompt_builder_options: Mapping[str, Any] = field(default_factory=dict)
    prompt_mode: str = "sequence_extension"
    include_reasoning: bool = True
    sampling: Mapping[str, Any] = field(default_factory=dict)
    cell_timeout_s: float | None = 300.0
    max_output_chars: int | None = None
    subagents: bool = True
    subagent_budget: str = "argument"
    checks: CellChecks = field(default_factory=CellChecks)
    stuck_in_loop_threshold: int = 4
    stuck_in_loop_window: int = 3

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> CodeActOptions:
        """Check `harness_options` (function harnesses get them unchecked) and fill the defaults."""
        _unknown(options, OPTIONS, "")
        values: dict[str, Any] = {}
        if options.get("prompt_builder") is not None:
            values["prompt_builder"] = _builder_class(options["prompt_builder"])
        if "prompt_builder_options" in options:
            values["prompt_builder_options"] = dict(_mapping(options, "prompt_builder_options"))
        if "prompt_mode" in options:
            mode = options["prompt_mode"]
            if mode not in PROMPT_MODES:
                raise CodeActOptionError(
                    f"prompt_mode must be one of {', '.join(PROMPT_MODES)}; got {mode!r}"
                )
            values["prompt_mode"] = mode
        for name in ("include_reasoning", "subagents"):
            if name in options:
                values[name] = _bool(options[name], name)
        if "sampling" in options:
            sampling = dict(_mapping(options, "sampling"))
            if "stop" in sampling:
                # The cell ends at the builder's stop sequences; another stop would cut cells apart.
                raise CodeActOptionError(
                    "sampling may not set 'stop': cells end at the builder's stop sequences"
                )
            values["sampling"] = sampling
        if "cell_timeout_s" in options:
            timeout = options["cell_timeout_s"]
            if timeout is not None and (
                isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
            ):
                raise CodeActOptionError(f"cell_timeout_s must be a positive number or null; got {timeout!r}")
            values["cell_timeout_s"] = None if timeout is None else float(timeout)
        if "max_output_chars" in options:
            limit = options["max_output_chars"]
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise CodeActOptionError(f"max_output_chars must be a positive int or null; got {limit!r}")
            values["max_output_chars"] = limit
        if "subagent_budget" in options:
            budget = options["subagent_budget"]
            if budget not in SUBAGENT_BUDGETS:
                raise CodeActOptionError(
                    f"subagent_budget must be one of {', '.join(SUBAGENT_BUDGETS)}; got {budget!r}"
                )
            values["subagent_budget"] = budget
        if options.get("checks") is not None:
            values.update(_checks(_mapping(options, "checks")))
        return cls(**values)


def _unknown(options: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> None:
    unknown = sorted(str(key) for key in options if key not in known)
    if unknown:
        raise CodeActOptionError(
            f"unknown platoon-codeact option(s) {', '.join(prefix + key for key in unknown)}; "
            f"the {'checks' if prefix else 'options'} are {', '.join(prefix + key for key in known)}"
        )


def _mapping(options: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = options[name]
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise CodeActOptionError(f"{name} must be a mapping; got {type(value).__name__}")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise CodeActOptionError(f"{name} must be true or false; got {value!r}")
    return value


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CodeActOptionError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value


def _checks(checks: Mapping[str, Any]) -> dict[str, Any]:
    _unknown(checks, CHECKS, "checks.")
    flags = {
        name: _bool(checks[name], f"checks.{name}")
        for name in ("unawaited_async_calls", "while_loops", "interactive_input")
        if name in checks
    }
    values: dict[str, Any] = {"checks": CellChecks(**flags)}
    if "stuck_in_loop_threshold" in checks:
        values["stuck_in_loop_threshold"] = _int(
            checks["stuck_in_loop_threshold"], "checks.stuck_in_loop_threshold", 1
        )
    if "stuck_in_loop_window" in checks:
        values["stuck_in_loop_window"] = _int(
            checks["stuck_in_loop_window"], "checks.stuck_in_loop_window", 0
        )
    return values


def _builder_class(ref: Any) -> type[CodeActPromptBuilder]:
    """The builder class an import path (`module:Class`, optionally `python://`) or a class names."""
    target = ref
    if isinstance(ref, str):
        target = resolve_import_string(ref.removeprefix("python://"))
    if not (isinstance(target, type) and issubclass(target, CodeActPromptBuilder)):
        raise CodeActOptionError(
            f"prompt_builder {ref!r} is not a CodeActPromptBuilder subclass "
            "(platoon.harness.codeact.CodeActPromptBuilder)"
        )
    return target


def build_prompt_builder(options: CodeActOptions) -> CodeActPromptBuilder:
    return options.prompt_builder(
        include_reasoning=options.include_reasoning,
        prompt_mode=options.prompt_mode,
        **options.prompt_builder_options,
    )


def option_problems(options: Mapping[str, Any]) -> list[str]:
    """What a run refuses to start with: an option platoon-codeact refuses, or a prompt builder that cannot be
    built from its options (an unknown one, a bad value, texts it needs that this site has not prepared)."""
    try:
        parsed = CodeActOptions.parse(options)
    except ValueError as exc:  # CodeActOptionError, or a prompt_builder that does not resolve
        return [str(exc)]
    except (ImportError, AttributeError) as exc:
        return [f"prompt_builder: {exc}"]
    try:
        build_prompt_builder(parsed)
    except (TypeError, ValueError) as exc:
        return [f"prompt_builder_options: {exc}"]
    return []


def prepare_options(options: Mapping[str, Any], cache_root: str | None, dry_run: bool) -> list[PrepareStep]:
    """`platoon prepare`'s steps for the prompt builder (`CodeActPromptBuilder.prepare_steps`); options that do
    not parse prepare nothing (validation reports them)."""
    try:
        parsed = CodeActOptions.parse(options)
    except (ValueError, ImportError, AttributeError):
        return []
    return parsed.prompt_builder.prepare_steps(dict(parsed.prompt_builder_options), cache_root, dry_run)


@harness("platoon-codeact", executes_model_code=True, check_options=option_problems, prepare=prepare_options)
async def codeact(ctx: AgentContext) -> AgentResult:
    """The model writes Python cells that call the environment's tools as functions."""
    options = CodeActOptions.parse(ctx.options)
    builder = build_prompt_builder(options)
    # Imported here: the executor brings IPython (on its own thread), which listing harnesses must not pay for.

    tools = await ctx.list_tools()

    async def launch(targets: Any, num_steps: int | None, context: str) -> str:
        goal = builder.subagent_goal(targets, context)
        task_misc = builder.subagent_task_misc(targets, context, parent_misc=ctx.task.misc)
        result = await ctx.agents.spawn(goal, max_steps=num_steps, task_misc=task_misc)
        return result.message

    executor = CodeActExecutor(
        tools,
        ctx.call_tool,
        terminal=final_answer_tool(tools),
        launch=launch if options.subagents else None,
        subagent_budget=options.subagent_budget,
        checks=options.checks,
        max_output_chars=options.max_output_chars,
    )
    try:
        await executor.start()
        functions = [
            CellFunction(spec.name, str(spec.signature), spec.description, spec.is_async)
            for spec in executor.specs
        ]
        state = builder.initial_state(builder.task_text(ctx.instruction, ctx.max_steps), functions)
        stop = builder.stop_sequences()
        steps = 0
        while True:
            if out_of_steps(ctx, steps):
                return AgentResult("limit", error=LIMIT_MESSAGE)
            if stuck_in_loop(
                [cell.code for cell in state.cells],
                threshold=options.stuck_in_loop_threshold,
                window=options.stuck_in_loop_window,
            ):
                # A synthetic cell: no model call, no step, no annotation. It goes through the namespace's
                # finish (so the terminal tool hears it), yet the agent ends with this message whatever finish is.
                await executor.run(f"finish({STUCK_MESSAGE!r})", options.cell_timeout_s, check=False)
                return AgentResult("completed", final_message=STUCK_MESSAGE)

            reply = await ctx.chat(builder.build_messages(state), stop=stop, **options.sampling)
            steps += 1
            parsed = builder.parse_reply(reply.text)
            outcome = await executor.run(parsed.code, options.cell_timeout_s)
            ctx.annotate_step(
                thought=parsed.thought, code=parsed.code, output=outcome.output, error=outcome.error
            )
            # The reply as returned (not re-rendered from the parse): the gateway then recognises it, and the next
            # prompt extends the tokens the model sampled.
            state.cells.append(
                CodeActCell(
                    parsed.thought,
                    parsed.code,
                    outcome.output,
                    outcome.error,
                    reply=reply.text,
                    reasoning=reply.reasoning,
                )
            )
            if outcome.timed_out:
                # The runtime cancels this agent's children without waiting when the harness reports timeout.
                return AgentResult("timeout", error=outcome.error)
            if executor.ended:
                return AgentResult("completed", final_message=executor.final_message)
    finally:
        # Launches still pending in cells are cancelled when the executor closes; their children run on, and
        # the runtime waits for them and grades them.
        ctx.agents.keep_children()
        await executor.aclose()
