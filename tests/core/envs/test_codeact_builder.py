"""The CodeAct prompt-builder contract: messages in both prompt modes, the action space, parsing, subagents."""

from __future__ import annotations

from pathlib import Path

import pytest

from platoon.harness.codeact import (
    STOP_SEQUENCES,
    CellFunction,
    CodeActCell,
    CodeActPromptBuilder,
    CodeActState,
)

FUNCTIONS = [
    CellFunction("guess", "(number: int) -> str", "Guess the hidden number.\nSays too low or too high."),
    CellFunction("launch_subagent", "(targets: str, num_steps: int, context: str = '')", "Delegate.", True),
]


def state_with_cells(builder: CodeActPromptBuilder) -> CodeActState:
    state = builder.initial_state(builder.task_text("Find it.", max_steps=5), FUNCTIONS)
    state.cells.append(CodeActCell("Start in the middle.", "guess(512)", "Too high, try again."))
    state.cells.append(CodeActCell("Lower.", "guess(x)", "", "NameError: name 'x' is not defined"))
    return state


def test_the_action_space_numbers_functions_with_indented_descriptions_and_an_await_note():
    builder = CodeActPromptBuilder()
    text = builder.action_space(FUNCTIONS)
    assert text.startswith("You can call these functions in your code:\n\n1. guess(number: int) -> str\n")
    assert "    Guess the hidden number.\n    Says too low or too high." in text
    assert "2. async launch_subagent(targets: str, num_steps: int, context: str = '')\n    Delegate." in text
    assert "must be awaited" in text
    assert "awaited" not in builder.action_space(FUNCTIONS[:1])
    assert builder.action_space([]) == ""
    assert FUNCTIONS[1].header == "async launch_subagent(targets: str, num_steps: int, context: str = '')"


def test_sequence_extension_messages():
    builder = CodeActPromptBuilder()
    messages = builder.build_messages(state_with_cells(builder))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "Jupyter-like notebook" in messages[0]["content"] and "<thought>" in messages[0]["content"]
    first = messages[1]["content"]
    assert first.startswith(
        "Your Goal: Find it.\nBudget: You have a total budget of 5 steps to complete this task.\n\n"
    )
    assert "1. guess(number: int) -> str" in first and first.endswith("\n\nProvide your next action.")
    assert (
        messages[2]["content"]
        == "<thought>\nStart in the middle.\n</thought>\n<python>\nguess(512)\n</python>"
    )
    assert messages[3]["content"] == "[Cell 1 Output]\nToo high, try again.\n\nProvide your next action."
    assert messages[5]["content"] == (
        "[Cell 2 Output]\n(No output)\nError: NameError: name 'x' is not defined\n\nProvide your next action."
    )


def test_without_reasoning_the_model_writes_python_only():
    builder = CodeActPromptBuilder(include_reasoning=False)
    system = builder.system_prompt()
    assert "<python>" in system and "<thought>" not in system
    messages = builder.build_messages(state_with_cells(builder))
    assert messages[2]["content"] == "<python>\nguess(512)\n</python>"


def test_no_sequence_extension_rebuilds_one_user_message_with_the_tagged_history():
    builder = CodeActPromptBuilder(prompt_mode="no_sequence_extension")
    messages = builder.build_messages(state_with_cells(builder))
    assert [m["role"] for m in messages] == ["system", "user"]
    body = messages[1]["content"]
    assert body.startswith("Your Goal: Find it.")
    assert (
        "Cell 1:\n<thought>\nStart in the middle.\n</thought>\n<python>\nguess(512)\n</python>\n"
        "<output>\nToo high, try again.\n</output>" in body
    )
    assert "Cell 2:" in body and "<output>\n(No output)\n</output>\n<error>\nNameError" in body
    assert body.count("<error>") == 1
    assert body.endswith("Provide your next action.")
    empty = builder.build_messages(builder.initial_state("Your Goal: Find it.", []))
    assert empty[1]["content"] == "Your Goal: Find it.\n\nProvide your next action."


def test_reply_parsing():
    builder = CodeActPromptBuilder()
    assert builder.stop_sequences() == ["</python>"] == list(STOP_SEQUENCES)
    reply = builder.parse_reply("<thought>\nMiddle.\n</thought>\n<python>\nguess(512)\n")
    assert (reply.thought, reply.code) == ("Middle.", "guess(512)")
    assert reply.text.endswith("</python>")
    only_code = builder.parse_reply("<python>\n    x = 1\nprint(x)</python>")
    assert (only_code.thought, only_code.code) == ("", "    x = 1\nprint(x)")
    apart = builder.parse_reply("<python>a()</python> trailing <thought>late</thought>")
    assert (apart.thought, apart.code) == ("late", "a()")
    assert builder.parse_reply("no tags at all").code == ""


def test_subagent_goal_and_misc():
    builder = CodeActPromptBuilder()
    assert builder.subagent_goal("Find the key") == "Find the key"
    assert builder.subagent_goal(["a", "b"], "it is in room 2") == (
        "['a', 'b']\n\nContext provided from parent agent: it is in room 2"
    )
    assert builder.subagent_task_misc("x", "") is None


def test_options_are_checked():
    with pytest.raises(TypeError, match="unknown options colour"):
        CodeActPromptBuilder(colour="red")
    with pytest.raises(ValueError, match="prompt_mode must be one of"):
        CodeActPromptBuilder(prompt_mode="sideways")
    with pytest.raises(ValueError, match="include_reasoning must be true or false"):
        CodeActPromptBuilder(include_reasoning="yes")  # type: ignore[arg-type]


def test_subclasses_override_methods_or_templates(tmp_path: Path):
    (tmp_path / "cell_output.j2").write_text("out {{ index }}: {{ output }}\n", encoding="utf-8")

    class Terse(CodeActPromptBuilder):
        template_dir = tmp_path

        def __init__(self, *, shout: bool = False, **options: object) -> None:
            super().__init__(**options)  # type: ignore[arg-type]
            self.shout = shout

        def system_prompt(self) -> str:
            return "SOLVE IT." if self.shout else "Solve it."

    builder = Terse(shout=True, include_reasoning=False)
    messages = builder.build_messages(state_with_cells(builder))
    assert messages[0]["content"] == "SOLVE IT."
    assert messages[3]["content"] == "out 1: Too high, try again."
    assert messages[1]["content"].startswith("Your Goal: Find it.")  # the other templates are the defaults


def test_the_five_templates_ship_with_the_package():
    folder = (
        Path(__import__("platoon.harness.codeact").harness.codeact.__file__).parent / "templates" / "codeact"
    )
    assert sorted(p.name for p in folder.iterdir()) == [
        "action_space.j2",
        "cell_output.j2",
        "history.j2",
        "initial_user.j2",
        "system_prompt.j2",
    ]


# ------------------------------------------------------------------------------------------- incremental prompts


class Counting(CodeActPromptBuilder):
    """Counts the prompt parts it renders."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.rendered: list[str] = []

    def render(self, template: str, **values: object) -> str:
        self.rendered.append(template)
        return super().render(template, **values)


def test_build_messages_renders_each_cell_once_and_gives_what_a_fresh_builder_gives():
    builder = Counting()
    state = builder.initial_state(builder.task_text("Find it.", max_steps=5), FUNCTIONS)
    for i in range(4):
        state.cells.append(CodeActCell(f"Try {i}.", f"guess({i})", f"Too low ({i})."))
        messages = builder.build_messages(state)
        assert messages == CodeActPromptBuilder().build_messages(state)
    # one system prompt, one first message, one output message per cell: nothing rendered twice
    assert builder.rendered.count("cell_output.j2") == 4
    assert builder.rendered.count("system_prompt.j2") == 1 and builder.rendered.count("initial_user.j2") == 1


def test_a_changed_cell_is_rendered_again_and_the_messages_are_the_callers_to_change():
    builder = Counting()
    state = state_with_cells(builder)
    first = builder.build_messages(state)
    first[3]["content"] = "edited by the caller"
    assert (
        builder.build_messages(state)[3]["content"]
        == "[Cell 1 Output]\nToo high, try again.\n\nProvide your next action."
    )
    state.cells[0].output = "Too low, try again."
    again = builder.build_messages(state)
    assert again[3]["content"].startswith("[Cell 1 Output]\nToo low, try again.")
    assert again[5]["content"].startswith("[Cell 2 Output]\n(No output)\nError: NameError")
    state.task = "Your Goal: Find another."
    assert builder.build_messages(state)[1]["content"].startswith("Your Goal: Find another.")


def test_a_cell_with_the_models_reply_goes_back_as_the_model_wrote_it():
    builder = CodeActPromptBuilder()
    state = builder.initial_state("Your Goal: Find it.", FUNCTIONS)
    reply = "<thought>Middle.</thought><python>guess(512)"
    state.cells.append(CodeActCell("Middle.", "guess(512)", "Too high.", reply=reply, reasoning="Halving."))
    assistant = builder.build_messages(state)[2]
    assert assistant == {"role": "assistant", "content": reply, "reasoning_content": "Halving."}


def test_builders_over_the_same_templates_share_them_compiled(tmp_path: Path):
    (tmp_path / "cell_output.j2").write_text("out {{ index }}\n", encoding="utf-8")

    class Custom(CodeActPromptBuilder):
        template_dir = tmp_path

    one, two, plain = Custom(), Custom(), CodeActPromptBuilder()
    for builder in (one, two, plain):
        builder.system_prompt()
    assert one._jinja is two._jinja and one._jinja is not plain._jinja
    other = CodeActPromptBuilder()
    other.system_prompt()
    assert other._jinja is plain._jinja
    assert one.cell_output_message(3, CodeActCell("", "x")) == "out 3"
