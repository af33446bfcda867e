"""The CodeAct prompt-builder contract: what `platoon-codeact` asks a builder for.

A builder turns the agent's state (the task text, the cell functions, the cells run so far) into Chat Completions
messages, and parses the model's replies back into a thought and a code cell. The harness itself lives in
platoon-harnesses; environments ship builders (`NumberSearchPromptBuilder`) by subclassing `CodeActPromptBuilder`
and overriding its methods or templates. Prompts are rendered from five Jinja templates in
`platoon/harness/templates/codeact/`: `system_prompt.j2`, `action_space.j2`, `initial_user.j2`, `cell_output.j2`
and `history.j2`.

Building a prompt is on every model call's path, so the compiled templates are shared by every builder with the same
template directory, and in `sequence_extension` mode `build_messages` renders only the cells it has not rendered
before (the earlier turns of a conversation do not change between calls). In that mode a cell that carries the
model's reply (`CodeActCell.reply`, which platoon-codeact sets) is sent back as the model wrote it, so the gateway
recognises its own reply and the next prompt extends the exact tokens it sampled (docs/gateway.md, "Token-in
history"); re-rendering it as `<thought>`/`<python>` would differ from the sample whenever the model's whitespace
or layout does, and training would see a new sequence of text the model never wrote.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from platoon.hookspecs import PrepareStep

__all__ = [
    "PROMPT_MODES",
    "STOP_SEQUENCES",
    "CellFunction",
    "CodeActCell",
    "CodeActPromptBuilder",
    "CodeActReply",
    "CodeActState",
    "PromptMode",
]

PromptMode = Literal["sequence_extension", "no_sequence_extension"]

#: The prompt modes: a growing conversation, or one user message rebuilt every step.
PROMPT_MODES: tuple[str, ...] = ("sequence_extension", "no_sequence_extension")

#: Sampling stops at the end of the code cell.
STOP_SEQUENCES: tuple[str, ...] = ("</python>",)

_TEMPLATES = Path(__file__).resolve().parent / "templates" / "codeact"

_PAIR = re.compile(r"<thought>(.*?)</thought>\s*<python>(.*?)</python>", re.DOTALL)
_THOUGHT = re.compile(r"<thought>(.*?)</thought>", re.DOTALL)
_PYTHON = re.compile(r"<python>(.*?)</python>", re.DOTALL)


@dataclass(frozen=True)
class CellFunction:
    """A function the model's cells may call: an environment tool, `finish` or `launch_subagent`.

    `signature` is the parameter list as Python writes it, with the return annotation if any:
    `"(number: int)"`, `"(path: str, limit: int | None = None) -> str"`. `is_async` functions must be awaited.
    """

    name: str
    signature: str
    description: str = ""
    is_async: bool = False

    @property
    def header(self) -> str:
        """`name(signature)`, prefixed `async ` for coroutine functions."""
        return f"{'async ' if self.is_async else ''}{self.name}{self.signature}"


@dataclass
class CodeActCell:
    """One executed cell: the model's thought and code, what the cell printed, and its error (None if it ran).

    `reply` is the model's reply text exactly as the gateway returned it (None for a cell built by hand), and
    `reasoning` its `reasoning_content`, if any: `sequence_extension` sends them back as the assistant turn.
    """

    thought: str
    code: str
    output: str = ""
    error: str | None = None
    reply: str | None = None
    reasoning: str | None = None


@dataclass
class CodeActState:
    """What a builder renders: the task text, the action-space text and the cells run so far, oldest first.

    `task` is the text the harness built ("Your Goal: ..." plus the budget line); `action_space` is the text
    `CodeActPromptBuilder.action_space(functions)` gave; `functions` are kept for builders that want them.
    """

    task: str
    action_space: str = ""
    functions: list[CellFunction] = field(default_factory=list)
    cells: list[CodeActCell] = field(default_factory=list)


@dataclass(frozen=True)
class CodeActReply:
    """A parsed model reply: the thought (or ""), the code (or ""), and the reply text with `</python>` restored."""

    thought: str
    code: str
    text: str


class CodeActPromptBuilder:
    """The default CodeAct builder; subclass it to change any part of the prompts.

    Options (the harness's `include_reasoning` and `prompt_mode`, then `prompt_builder_options`) arrive as
    constructor keyword arguments; an unknown one raises `TypeError` naming it. Override points: `system_prompt`,
    `action_space`, `initial_user_message`, `cell_output_message`, `history_message`, `assistant_message`,
    `subagent_goal`, `subagent_task_misc`, `stop_sequences`, `parse_reply`; or set `template_dir` to a directory
    holding templates of the same names (those present replace the defaults). Templates are read once per process
    and directory (edits to them are not picked up while it runs).

    `build_messages` keeps what it rendered: the system and first user messages per task text and action space, and
    each cell's turn pair while the cell's fields stay the same. The prompt-part methods must therefore give the
    same text for the same arguments (a builder whose parts change otherwise overrides `build_messages`).
    """

    #: a directory of templates overriding the defaults by file name; None uses only the defaults
    template_dir: str | Path | None = None

    def __init__(
        self,
        *,
        include_reasoning: bool = True,
        prompt_mode: PromptMode | str = "sequence_extension",
        **options: Any,
    ) -> None:
        if options:
            raise TypeError(
                f"{type(self).__name__} got unknown options {', '.join(sorted(options))} "
                "(prompt_builder_options must match the builder's constructor)"
            )
        if prompt_mode not in PROMPT_MODES:
            raise ValueError(f"prompt_mode must be one of {', '.join(PROMPT_MODES)}; got {prompt_mode!r}")
        if not isinstance(include_reasoning, bool):
            raise ValueError(f"include_reasoning must be true or false; got {include_reasoning!r}")
        self.include_reasoning = include_reasoning
        self.prompt_mode: str = prompt_mode
        self._jinja: Any = None
        # build_messages' memory: ((task, action_space), [system, first user]) and, per cell rendered so far,
        # (the cell's fields, its assistant message, its output message)
        self._head: tuple[tuple[str, str], list[dict[str, str]]] | None = None
        self._turns: list[tuple[tuple[Any, ...], dict[str, str], dict[str, str]]] = []

    # -- site preparation ------------------------------------------------------------------------------------

    @classmethod
    def prepare_steps(
        cls, options: Mapping[str, Any], cache_root: str | None, dry_run: bool
    ) -> list[PrepareStep]:
        """What `platoon prepare` makes once per site for a builder with these `prompt_builder_options` (a download
        of texts, say); none by default. A builder that needs such a step refuses, in its constructor, to be built
        without it, naming `platoon prepare`: platoon-codeact builds it when a run's options are checked, so the run
        stops before any rollout. With `dry_run` nothing is made (a step that would be is `missing`)."""
        return []

    # -- templates -------------------------------------------------------------------------------------------

    def render(self, template: str, **values: Any) -> str:
        """Render one of the templates (`"system_prompt.j2"`, ...) with `values`; trailing whitespace dropped."""
        if self._jinja is None:
            directory = self.template_dir
            self._jinja = _environment(None if directory is None else str(Path(directory).resolve()))
        text: str = self._jinja.get_template(template).render(**values)
        return text.rstrip()

    # -- prompt parts ----------------------------------------------------------------------------------------

    def system_prompt(self) -> str:
        """The system message: a notebook agent answering in `<thought>`/`<python>` (or `<python>` only)."""
        return self.render("system_prompt.j2", include_reasoning=self.include_reasoning)

    def action_space(self, functions: Sequence[CellFunction]) -> str:
        """The numbered description of the cell functions (signature, indented description, an await note)."""
        if not functions:
            return ""
        return self.render(
            "action_space.j2", functions=list(functions), any_async=any(f.is_async for f in functions)
        )

    def task_text(self, instruction: str, max_steps: int | None = None) -> str:
        """The task text of the state: "Your Goal: ..." plus the step budget when `max_steps` is set."""
        text = f"Your Goal: {instruction}"
        if max_steps:
            text += f"\nBudget: You have a total budget of {max_steps} steps to complete this task."
        return text

    def initial_state(self, task: str, functions: Sequence[CellFunction]) -> CodeActState:
        """A fresh state for `task` (the task text) with the action space of `functions`."""
        return CodeActState(task=task, action_space=self.action_space(functions), functions=list(functions))

    def initial_user_message(self, state: CodeActState) -> str:
        """The first user message of `sequence_extension`: the task, the action space, the next-action line."""
        return self.render("initial_user.j2", task=state.task, action_space=state.action_space)

    def assistant_message(self, cell: CodeActCell) -> str:
        """A cell as the model's turn: the reply as the model wrote it when the cell has one, else `<thought>`
        (when reasoning is on) and `<python>` blocks."""
        if cell.reply is not None:
            return cell.reply
        code = f"<python>\n{cell.code}\n</python>"
        if not self.include_reasoning:
            return code
        return f"<thought>\n{cell.thought}\n</thought>\n{code}"

    def cell_output_message(self, index: int, cell: CodeActCell) -> str:
        """The user turn after cell `index` (1-based): "[Cell i Output]", the output or "(No output)", any error."""
        return self.render("cell_output.j2", index=index, output=cell.output, error=cell.error)

    def history_message(self, state: CodeActState) -> str:
        """The single user message of `no_sequence_extension`: task, action space, every cell tagged, next action."""
        return self.render(
            "history.j2",
            task=state.task,
            action_space=state.action_space,
            cells=state.cells,
            include_reasoning=self.include_reasoning,
        )

    def build_messages(self, state: CodeActState) -> list[dict[str, str]]:
        """The Chat Completions messages for the next model call, in the builder's prompt mode (new dicts each
        call: the caller may change them)."""
        if self.prompt_mode == "no_sequence_extension":
            return [
                {"role": "system", "content": self.system_prompt()},
                {"role": "user", "content": self.history_message(state)},
            ]
        key = (state.task, state.action_space)
        if self._head is None or self._head[0] != key:
            self._head = (
                key,
                [
                    {"role": "system", "content": self.system_prompt()},
                    {"role": "user", "content": self.initial_user_message(state)},
                ],
            )
            self._turns.clear()
        messages = [dict(message) for message in self._head[1]]
        turns = self._turns
        for index, cell in enumerate(state.cells, start=1):
            fields = (cell.thought, cell.code, cell.output, cell.error, cell.reply, cell.reasoning)
            if index > len(turns) or turns[index - 1][0] != fields:
                # A new cell, or an earlier one changed: render it and forget the turns after it.
                del turns[index - 1 :]
                assistant = {"role": "assistant", "content": self.assistant_message(cell)}
                if cell.reasoning:
                    assistant["reasoning_content"] = cell.reasoning
                turns.append(
                    (fields, assistant, {"role": "user", "content": self.cell_output_message(index, cell)})
                )
            _, assistant, output = turns[index - 1]
            messages.append(dict(assistant))
            messages.append(dict(output))
        return messages

    # -- subagents -------------------------------------------------------------------------------------------

    def subagent_goal(self, targets: Any, context: str = "") -> str:
        """The goal of a child launched with `launch_subagent(targets, ..., context)`."""
        goal = str(targets)
        if context:
            goal += f"\n\nContext provided from parent agent: {context}"
        return goal

    def subagent_task_misc(
        self, targets: Any, context: str = "", *, parent_misc: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The child task's misc; None (the default) shares the parent task's misc."""
        return None

    # -- sampling and parsing --------------------------------------------------------------------------------

    def stop_sequences(self) -> list[str]:
        """Stop sequences for sampling: the end of the code cell."""
        return list(STOP_SEQUENCES)

    def parse_reply(self, text: str) -> CodeActReply:
        """Split a reply into thought and code.

        Sampling stops at `</python>`, so the tag is appended when missing. A `<thought>...</thought>` followed by
        `<python>...</python>` is taken as a pair; otherwise each tag is looked for on its own (missing -> "").
        """
        if "</python>" not in text:
            text += "</python>"
        pair = _PAIR.search(text)
        if pair is not None:
            return CodeActReply(pair.group(1).strip(), _code(pair.group(2)), text)
        thought = _THOUGHT.search(text)
        code = _PYTHON.search(text)
        return CodeActReply(
            thought.group(1).strip() if thought else "",
            _code(code.group(1)) if code else "",
            text,
        )


@functools.lru_cache(maxsize=32)
def _environment(template_dir: str | None) -> Any:
    """The Jinja environment of a template directory (over the defaults), shared by every builder using it.

    Templates compile once per process: `auto_reload` off means no file is checked again on later renders.
    """
    import jinja2

    loaders: list[jinja2.BaseLoader] = []
    if template_dir is not None:
        loaders.append(jinja2.FileSystemLoader(template_dir))
    loaders.append(jinja2.FileSystemLoader(str(_TEMPLATES)))
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        undefined=jinja2.StrictUndefined,
        auto_reload=False,
    )


def _code(text: str) -> str:
    # Leading blank lines and trailing whitespace go; the first line's indentation is the model's and stays.
    return text.lstrip("\n").rstrip()
