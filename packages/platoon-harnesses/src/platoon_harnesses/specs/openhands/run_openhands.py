"""Run one OpenHands agent (openhands-sdk + openhands-tools 1.54.0) on a task: the `openhands@1.54.0` spec's launcher.

It runs with the toolchain's own interpreter (`{toolchain}/bin/python3 -I`), never platoon's: only the standard
library and the OpenHands SDK are imported, and the SDK only after the arguments are checked and the settings line
is printed. The model is reached through the OpenAI-compatible endpoint in LLM_BASE_URL with LLM_MODEL and
LLM_API_KEY; the key is popped from the environment before any tool starts, so the agent's shell never sees it.

Tools: Terminal, FileEditor and TaskTracker, plus the SDK's own finish and think; no skills, no security analyzer,
no delegation. The workspace is the working directory. With reasoning replay on, an LLM subclass sends each
assistant turn back as the model wrote it (its reasoning_content, its text as one string, whitespace-only text
kept on tool-call turns), so every prompt extends the previous one and the gateway reuses its tokens.

Exit status: 0 finished, 3 the iteration limit (a `MaxIterationsReached` error event), 4 stuck in a loop, 1
anything else, 2 bad arguments or environment. The final message (the finish tool's message, else the agent's
last text) is written to --final-message-file when there is one. The first stdout line is
`openhands: settings {json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

EXIT_FINISHED = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_MAX_ITERATIONS = 3
EXIT_STUCK = 4

CONDENSERS = ("none", "llm_summarizing")
SDK_VERSION = "1.54.0"
#: the environment the launch sets; LLM_API_KEY is popped before any tool starts
ENV_MODEL, ENV_BASE_URL, ENV_API_KEY = "LLM_MODEL", "LLM_BASE_URL", "LLM_API_KEY"


# ---------------------------------------------------------------------------------------------- arguments


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _int_in(low: int, high: int | None) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"expected a whole number {bound}, got {value}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_openhands.py", description="Run one OpenHands agent on a task.")
    p.add_argument("--instruction-file", required=True, help="the task, as text")
    p.add_argument("--final-message-file", required=True, help="where the final message is written")
    p.add_argument("--max-iterations", type=_int_in(1, None), required=True, help="max_iteration_per_run")
    p.add_argument(
        "--reasoning-replay", type=_bool, default=True, help="send turns back as the model wrote them"
    )
    p.add_argument("--llm-timeout", type=_int_in(1, None), default=3600, help="seconds per model request")
    p.add_argument("--num-retries", type=_int_in(0, 10), default=0, help="retries of a failed model request")
    p.add_argument("--condenser", choices=CONDENSERS, default="none", help="history condenser")
    return p


def settings(args: argparse.Namespace, env: dict[str, str], workspace: str) -> dict[str, Any]:
    """What the first stdout line reports (never the key)."""
    return {
        "model": env[ENV_MODEL],
        "base_url": env[ENV_BASE_URL],
        "max_iterations": args.max_iterations,
        "reasoning_replay": args.reasoning_replay,
        "llm_timeout": args.llm_timeout,
        "num_retries": args.num_retries,
        "condenser": args.condenser,
        "workspace": workspace,
        "sdk": SDK_VERSION,
    }


# ---------------------------------------------------------------------------------------------- outcomes


def exit_code(status: str, error_codes: Iterable[str]) -> int:
    """The exit status of a run from the conversation's final execution status and its error events' codes."""
    if "MaxIterationsReached" in set(error_codes):
        return EXIT_MAX_ITERATIONS
    if status == "stuck":
        return EXIT_STUCK
    if status == "finished":
        return EXIT_FINISHED
    return EXIT_ERROR


def final_message(events: Sequence[Any]) -> str | None:
    """The finish tool's message (the last one), else the agent's last text message, else None."""
    from openhands.sdk.event import ActionEvent, MessageEvent
    from openhands.sdk.llm import TextContent
    from openhands.sdk.tool.builtins import FinishAction

    for event in reversed(events):
        if (
            isinstance(event, ActionEvent)
            and event.source == "agent"
            and isinstance(event.action, FinishAction)
        ):
            return str(event.action.message)
    for event in reversed(events):
        if isinstance(event, MessageEvent) and event.source == "agent":
            text = "".join(c.text for c in event.llm_message.content if isinstance(c, TextContent))
            if text:
                return text
    return None


# ---------------------------------------------------------------------------------------------- the SDK


def replay_llm_class() -> type:
    """An LLM that sends assistant turns back as the model wrote them (reasoning replay)."""
    from openhands.sdk import LLM
    from openhands.sdk.llm import Message, TextContent

    class ReplayLLM(LLM):
        def _to_chat_dicts(self, messages: list[Message]) -> list[dict[str, Any]]:
            dicts = super()._to_chat_dicts(messages)
            for message, wire in zip(messages, dicts, strict=True):
                if message.role != "assistant":
                    continue
                # One string, as sampled: the SDK's list form and its dropping of whitespace-only text on
                # tool-call turns would each make the next prompt differ from the tokens the model produced.
                text = "\n".join(c.text for c in message.content if isinstance(c, TextContent))
                if text or not message.tool_calls:
                    wire["content"] = text
                else:
                    wire.pop("content", None)
                if message.reasoning_content:
                    wire["reasoning_content"] = message.reasoning_content
            return dicts

    return ReplayLLM


def run(args: argparse.Namespace, model: str, base_url: str, api_key: str, instruction: str) -> int:
    from openhands.sdk import LLM, Agent, Conversation, LLMSummarizingCondenser, Tool
    from openhands.sdk.context.condenser import default_condenser
    from openhands.sdk.conversation.state import ConversationExecutionStatus
    from openhands.sdk.event.conversation_error import ConversationErrorEvent
    from openhands.tools.file_editor import FileEditorTool
    from openhands.tools.task_tracker import TaskTrackerTool
    from openhands.tools.terminal import TerminalTool

    llm_class = replay_llm_class() if args.reasoning_replay else LLM
    llm = llm_class(
        model=model,
        base_url=base_url,
        api_key=api_key,
        api_mode="chat",  # the gateway serves this spec's dialect, openai_chat
        timeout=args.llm_timeout,
        num_retries=args.num_retries,
        usage_id="agent",
    )
    condenser: LLMSummarizingCondenser | None = None
    if args.condenser == "llm_summarizing":
        # Its calls go out unmarked, as policy calls: a sandboxed agent may make no other kind.
        condenser = default_condenser(llm.model_copy(update={"usage_id": "condenser"}))
    agent = Agent(
        llm=llm,
        tools=[Tool(name=TerminalTool.name), Tool(name=FileEditorTool.name), Tool(name=TaskTrackerTool.name)],
        condenser=condenser,
    )
    conversation = Conversation(
        agent=agent, workspace=os.getcwd(), max_iteration_per_run=args.max_iterations, visualizer=None
    )
    try:
        conversation.send_message(instruction)
        try:
            conversation.run()
        except Exception as exc:  # the SDK raises after recording the error event; the mapping below reads it
            print(f"openhands: the run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        events = list(conversation.state.events)
        status = conversation.state.execution_status
        status_name = status.value if isinstance(status, ConversationExecutionStatus) else str(status)
        codes = [e.code for e in events if isinstance(e, ConversationErrorEvent)]
        message = final_message(events)
    finally:
        conversation.close()
    if message is not None:
        with open(args.final_message_file, "w", encoding="utf-8") as out:
            out.write(message)
    code = exit_code(status_name, codes)
    print(f"openhands: status {status_name}, errors {codes}, exit {code}", flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    missing = [name for name in (ENV_MODEL, ENV_BASE_URL, ENV_API_KEY) if not os.environ.get(name)]
    if missing:
        print(f"run_openhands.py: set {', '.join(missing)} in the environment", file=sys.stderr)
        return EXIT_USAGE
    try:
        with open(args.instruction_file, encoding="utf-8") as source:
            instruction = source.read()
    except OSError as exc:
        print(f"run_openhands.py: cannot read --instruction-file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    env = dict(os.environ)
    # Popped before any tool starts: the terminal's shell inherits this process's environment.
    api_key = os.environ.pop(ENV_API_KEY)
    print("openhands: settings " + json.dumps(settings(args, env, os.getcwd()), sort_keys=True), flush=True)
    try:
        import openhands.sdk  # noqa: F401
    except ImportError as exc:
        print(f"run_openhands.py: the OpenHands SDK is not importable here ({exc})", file=sys.stderr)
        return EXIT_ERROR
    return run(args, env[ENV_MODEL], env[ENV_BASE_URL], api_key, instruction)


if __name__ == "__main__":
    sys.exit(main())
