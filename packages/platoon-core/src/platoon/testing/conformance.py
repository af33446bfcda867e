"""The token-exactness conformance matrix: renderer x dialect x form cells, each a multi-turn conversation.

A cell runs a conversation of at least three model calls through one dialect of the gateway: in process
(`ModelGateway.chat`), Chat Completions (the real `openai` client, plain and streamed), Responses (`openai`'s
`responses.create`) or Anthropic Messages (the real `anthropic` client). The "model" is a `ScriptedPolicy` writing
each assistant turn in the renderer family's own format (a form: plain answers, tool calls, parallel tool calls,
raw non-ASCII, compact JSON, no separator before the tool-call block, reasoning); the harness side sends back what
that dialect's client sends back: the assistant message or items as returned, then tool results or a user turn.

Then, for every recorded call of the agent:

- its prompt extends the previous call's prompt and sampled tokens, or the call records that a new segment starts
  for a reason of the chat format (`generation["history"]["segment"]` in `FORMAT_SEGMENTS`);
- the datums the trainer builds from the rollout hold exactly the sampled tokens, loss mask 1 on
  them and 0 elsewhere, one datum per segment.

A cell is "extends" (every call extends the previous one), "segment" (some calls start documented segments) or
"broken" (a call does neither, the datums differ, the reply lost what the model wrote, or the call failed).

The runner is here rather than in the test suite so that a renderer of one's own can be checked the same way:
give `Bench` the renderer and a `Writer` that writes its format. `SPECS` holds platoon's named renderers, each with
the tokenizer (of `scripts/fetch_test_tokenizers.py`) it is checked over and its family's writer.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from platoon.envs.service import Outcome
from platoon.gateway.http import GatewayServer
from platoon.gateway.trace import build_collection
from platoon.renderers.tokenizers import TokenizersTokenizer
from platoon.testing.gateway import make_gateway
from platoon.testing.policy import Completion, ScriptedPolicy, sample_response
from platoon.train.tinker.datums import collection_datums

if TYPE_CHECKING:
    import tinker

    from platoon.gateway.core import ModelGateway, RolloutRecorder
    from platoon.gateway.plain_sampling import PlainSample
    from platoon.gateway.records import AgentRecord

__all__ = [
    "DIALECTS",
    "FORMAT_SEGMENTS",
    "FORMS",
    "SPECS",
    "Bench",
    "Call",
    "CellResult",
    "RendererSpec",
    "Turn",
    "TurnPolicy",
    "Writer",
    "cell_id",
    "format_matrix",
    "load_tokenizer",
    "not_applicable",
    "run_matrix",
    "script",
    "tokenizers_dir",
]

#: the ways a harness reaches the model: in process, Chat Completions (plain, streamed), Responses, Messages
DIALECTS = ("inproc", "chat", "chat_stream", "responses", "anthropic")
#: what the model writes
FORMS = (
    "plain",
    "tool_calls",
    "parallel_tool_calls",
    "non_ascii",
    "compact_json",
    "no_separator",
    "reasoning",
)
#: forms that need the renderer to read tool calls
TOOL_FORMS = frozenset(("tool_calls", "parallel_tool_calls", "compact_json", "no_separator"))

#: The segment reasons (`generation["history"]["segment"]`, docs/gateway.md "Token-in history") where the chat
#: format itself keeps a prompt from extending the previous one: the renderer writes the earlier turns differently
#: in history. A cell's harness sends every reply back as it was returned, so any other reason (`no_matching_call`,
#: `turn_not_found`, ...) means the gateway did not reuse a turn it recorded: the cell is broken.
FORMAT_SEGMENTS = frozenset(("history_rerendered", "prefill_dropped", "reasoning_dropped"))

SYSTEM = "You are a weather agent."
MODEL = "conformance"


# --------------------------------------------------------------------------------------------------------------
# What the model writes


@dataclass(frozen=True)
class Call:
    """A tool call the model writes: the function name and its arguments."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Turn:
    """One assistant turn as the model writes it, and what the harness answers.

    `compact`: JSON written without spaces (`{"a":1}`). `separator`: the family's separator between the content and
    the tool-call block (Hermes and XML families write a newline); False writes the block right after the content.
    `results` are the tool results sent back, one per call; `then_user` the user turn after a turn without calls.
    """

    content: str = ""
    calls: tuple[Call, ...] = ()
    reasoning: str | None = None
    compact: bool = False
    separator: bool = True
    results: tuple[str, ...] = ()
    then_user: str | None = None


OSLO = Call("weather", {"city": "Oslo"})
BERGEN = Call("weather", {"city": "Bergen"})
BEIJING = Call("weather", {"city": "北京"})
HOURS = Call("weather", {"city": "Oslo", "opts": {"units": "C", "hours": [6, 12]}})

TOOL = {
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city."},
            "opts": {"type": "object", "description": "Units and hours."},
        },
        "required": ["city"],
    },
}


def script(form: str, *, tools: bool = True) -> tuple[str, list[Turn]]:
    """The first user message and the assistant turns of a form (for a renderer without tool calls, `non_ascii`
    writes non-ASCII answers only)."""
    bye = [Turn("Bye.")]
    if form == "plain":
        return "Hello!", [
            Turn("Hi there.", then_user="And tomorrow?"),
            Turn("Sunny, 20 degrees.", then_user="Thanks."),
            *bye,
        ]
    if form == "tool_calls":
        return "Weather in Oslo?", [
            Turn("Let me look.", (OSLO,), results=("12 degrees",)),
            Turn("It is 12 degrees in Oslo.", then_user="Thanks."),
            *bye,
        ]
    if form == "parallel_tool_calls":
        return "Weather in Oslo and Bergen?", [
            Turn("Checking both.", (OSLO, BERGEN), results=("12 degrees", "9 degrees")),
            Turn("Oslo 12, Bergen 9.", then_user="Thanks."),
            *bye,
        ]
    if form == "non_ascii":
        if not tools:
            return "北京天气怎么样", [
                Turn("北京今天晴 25度。", then_user="谢谢"),
                Turn("不客气。", then_user="再见"),
                Turn("再见。"),
            ]
        return "北京天气怎么样", [
            Turn("我查一下。", (BEIJING,), results=("晴 25度",)),
            Turn("北京今天晴 25度。", then_user="谢谢"),
            Turn("不客气。"),
        ]
    if form == "compact_json":
        return "Oslo at 6 and 12, in Celsius?", [
            Turn("Let me look.", (HOURS,), compact=True, results=("6: 8 C, 12: 12 C",)),
            Turn("8 C at 6, 12 C at noon.", then_user="Thanks."),
            *bye,
        ]
    if form == "no_separator":
        return "Oslo, then Bergen?", [
            Turn("", (OSLO,), separator=False, results=("12 degrees",)),
            Turn("Now Bergen.", (BERGEN,), separator=False, results=("9 degrees",)),
            Turn("Oslo 12, Bergen 9.", then_user="Thanks."),
            *bye,
        ]
    if form == "reasoning":
        return "Weather in Oslo?", [
            Turn(
                "Let me look.", (OSLO,), reasoning="The user wants Oslo's weather.", results=("12 degrees",)
            ),
            Turn("It is 12 degrees in Oslo.", reasoning="The tool said 12.", then_user="Thanks."),
            Turn("Bye.", reasoning="They are done."),
        ]
    raise ValueError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")


def _json(value: Any, compact: bool) -> str:
    # Models write non-ASCII raw: the UTF-8 text, not \\u escapes.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":") if compact else None)


# --------------------------------------------------------------------------------------------------------------
# Writers: one turn in a family's own format


#: the token a turn ends on: its id, its text (one token of the tokenizer), or None when the turn's text ends with
#: the renderer's stop text instead
End = int | str | None


class Writer(Protocol):
    """Writes a turn as the model's completion text and names the token that ends it. `stop` is the renderer's
    first stop token, `index` the number of tool calls written before in the conversation. `not_applicable(form)`
    says why a form cannot be written, or None."""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]: ...

    def not_applicable(self, form: str) -> str | None: ...


@dataclass(frozen=True)
class Think:
    """How the model writes reasoning: `before` + reasoning + `close`, or `bare` when it has none. A renderer whose
    prompt opens the block (a `<think>` prefill) has an empty `before`."""

    before: str
    close: str
    bare: str = ""

    def write(self, reasoning: str | None) -> str:
        return self.bare if reasoning is None else self.before + reasoning + self.close


@dataclass(frozen=True)
class _Base:
    think: Think | None = None
    #: why reasoning cannot be written (thinking off, or a model that writes none)
    no_reasoning: str = "the renderer's model writes no reasoning"
    no_tools: str | None = None

    def not_applicable(self, form: str) -> str | None:
        if form == "reasoning" and self.think is None:
            return self.no_reasoning
        if form in TOOL_FORMS and self.no_tools is not None:
            return self.no_tools
        return None


@dataclass(frozen=True)
class Hermes(_Base):
    """Qwen3's `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` blocks, a newline before each one
    (none before the first when there is no content, as Qwen3's template writes)."""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        text = (self.think.write(turn.reasoning) if self.think else "") + turn.content
        for i, call in enumerate(turn.calls):
            if i > 0 or (turn.content and turn.separator):
                text += "\n"
            args = _json(dict(call.arguments), turn.compact)
            if turn.compact:
                body = '{"name":' + _json(call.name, True) + ',"arguments":' + args + "}"
            else:
                body = '{"name": ' + _json(call.name, False) + ', "arguments": ' + args + "}"
            text += f"<tool_call>\n{body}\n</tool_call>"
        return text, stop


@dataclass(frozen=True)
class Xml(_Base):
    """Qwen3.5's and Nemotron 3's `<tool_call>\\n<function=name>\\n<parameter=k>\\nvalue\\n</parameter>\\n...`
    blocks: `first` between the content and the first block, newlines between blocks, `trailing` after them."""

    first: str = "\n\n"
    trailing: str = ""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        text = (self.think.write(turn.reasoning) if self.think else "") + turn.content
        if turn.calls:
            if turn.content and turn.separator:
                text += self.first
            blocks = []
            for call in turn.calls:
                params = "".join(
                    f"<parameter={key}>\n{value if isinstance(value, str) else _json(value, turn.compact)}\n"
                    "</parameter>\n"
                    for key, value in call.arguments.items()
                )
                blocks.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
            text += "\n".join(blocks) + self.trailing
        return text, stop


def _deepseek(name: str) -> str:
    """A DeepSeek special token: `<|name|>` with fullwidth bars (written escaped to keep the source legible)."""
    return f"<\uff5c{name}\uff5c>"


@dataclass(frozen=True)
class DeepSeek(_Base):
    """DeepSeek V3.1's `<|tool▁calls▁begin|><|tool▁call▁begin|>name<|tool▁sep|>{args}<|tool▁call▁end|>...` (the
    bars are fullwidth), right after the content (the format has no separator)."""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        text = (self.think.write(turn.reasoning) if self.think else "") + turn.content
        if turn.calls:
            text += _deepseek("tool▁calls▁begin")
            for call in turn.calls:
                args = _json(dict(call.arguments), turn.compact)
                text += (
                    _deepseek("tool▁call▁begin")
                    + call.name
                    + _deepseek("tool▁sep")
                    + args
                    + _deepseek("tool▁call▁end")
                )
            text += _deepseek("tool▁calls▁end")
        return text, stop


@dataclass(frozen=True)
class Kimi(_Base):
    """Kimi K2's `<|tool_calls_section_begin|><|tool_call_begin|>functions.name:N<|tool_call_argument_begin|>{args}
    <|tool_call_end|>...<|tool_calls_section_end|>` right after the content; N counts the conversation's calls."""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        text = (self.think.write(turn.reasoning) if self.think else "") + turn.content
        if turn.calls:
            text += "<|tool_calls_section_begin|>"
            for offset, call in enumerate(turn.calls):
                args = _json(dict(call.arguments), turn.compact)
                text += (
                    f"<|tool_call_begin|>functions.{call.name}:{index + offset}"
                    f"<|tool_call_argument_begin|>{args}<|tool_call_end|>"
                )
            text += "<|tool_calls_section_end|>"
        return text, stop


@dataclass(frozen=True)
class Harmony(_Base):
    """gpt-oss's harmony messages after the prompt's `<|start|>assistant`: reasoning on the analysis channel, a
    preamble on commentary, a call ` to=functions.name<|channel|>commentary <|constrain|>json<|message|>{args}`
    ending on `<|call|>`, an answer on the final channel ending on `<|return|>`."""

    def not_applicable(self, form: str) -> str | None:
        if form == "parallel_tool_calls":
            return "harmony ends a sample at its first <|call|>: one call per sample"
        if form == "no_separator":
            return "harmony separates messages with special tokens: there is no newline to leave out"
        return super().not_applicable(form)

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        messages = []
        if turn.reasoning is not None:
            messages.append(f"<|channel|>analysis<|message|>{turn.reasoning}<|end|>")
        if turn.calls:
            (call,) = turn.calls
            if turn.content:
                messages.append(f"<|channel|>commentary<|message|>{turn.content}<|end|>")
            args = _json(dict(call.arguments), turn.compact)
            messages.append(
                f" to=functions.{call.name}<|channel|>commentary <|constrain|>json<|message|>{args}"
            )
            end = "<|call|>"
        else:
            messages.append(f"<|channel|>final<|message|>{turn.content}")
            end = "<|return|>"
        return "<|start|>assistant".join(messages), end


@dataclass(frozen=True)
class Plain(_Base):
    """Text only (`llama3`): the content, then the stop token."""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        return turn.content, stop


@dataclass(frozen=True)
class RoleColon(_Base):
    """`role_colon`: ` content` then the stop text `\\n\\nUser:` (it has no stop token)."""

    def write(self, turn: Turn, stop: int | None, index: int) -> tuple[str, End]:
        return f" {turn.content}\n\nUser:", None


# --------------------------------------------------------------------------------------------------------------
# platoon's named renderers


QWEN3_THINK = Think("<think>\n", "\n</think>\n\n")
THINKING_OFF = "thinking is off: the prompt closes the think block"
INSTRUCT = "an instruct model (Qwen3 2507) writes no reasoning"
NO_TOOLS = "the renderer declares no tools and reads no tool calls"


@dataclass(frozen=True)
class RendererSpec:
    """A named renderer: the tokenizer it is checked over (`load_tokenizer`'s kinds) and its family's writer.
    `tools`: whether conversations carry tool definitions."""

    tokenizer: str
    writer: Writer
    tools: bool = True


def _specs() -> dict[str, RendererSpec]:
    hermes_off = Hermes(None, THINKING_OFF)
    deepseek_off = DeepSeek(None, "thinking is off: the prompt ends with </think>")
    xml_qwen = {"first": "\n\n", "trailing": ""}
    xml_nemotron = {"first": "\n", "trailing": "\n"}
    harmony = Harmony(Think("", ""))  # reasoning goes on the analysis channel
    specs = {
        # The chat template renderer and its aliases run Qwen3's own template (the transformers tokenizer).
        "chat_template": RendererSpec("qwen3_hf", Hermes(QWEN3_THINK)),
        "qwen3_6_preserve_thinking": RendererSpec("qwen3_hf", Hermes(QWEN3_THINK)),
        "qwen3_6_preserve_thinking_disable_thinking": RendererSpec("qwen3_hf", hermes_off),
        "qwen3_8_preserve_thinking": RendererSpec("qwen3_hf", Hermes(QWEN3_THINK)),
        "qwen3_8_preserve_thinking_disable_thinking": RendererSpec("qwen3_hf", hermes_off),
        "qwen3": RendererSpec("qwen3", Hermes(QWEN3_THINK)),
        "qwen3_disable_thinking": RendererSpec("qwen3", hermes_off),
        "qwen3_instruct": RendererSpec("qwen3", Hermes(None, INSTRUCT)),
        # text only: the gateway builds the VL renderers without an image processor
        "qwen3_vl": RendererSpec("qwen3", Hermes(QWEN3_THINK)),
        "qwen3_vl_instruct": RendererSpec("qwen3", Hermes(None, INSTRUCT)),
        "role_colon": RendererSpec(
            "qwen3",
            RoleColon(None, "the renderer has no reasoning", "the renderer has no tool calling"),
            False,
        ),
        "llama3": RendererSpec("llama3", Plain(None, "Llama 3 writes no reasoning", NO_TOOLS), False),
        "deepseekv3": RendererSpec("deepseek_v3", deepseek_off),
        "deepseekv3_disable_thinking": RendererSpec("deepseek_v3", deepseek_off),
        "deepseekv3_thinking": RendererSpec("deepseek_v3", DeepSeek(Think("", "</think>", "</think>"))),
        "gpt_oss_no_sysprompt": RendererSpec("gpt_oss", harmony),
        "gpt_oss_low_reasoning": RendererSpec("gpt_oss", harmony),
        "gpt_oss_medium_reasoning": RendererSpec("gpt_oss", harmony),
        "gpt_oss_high_reasoning": RendererSpec("gpt_oss", harmony),
        # Kimi and Nemotron run over the Qwen3 tokenizer, as their golden renders do (logic, not their own).
        "qwen3_5": RendererSpec("qwen3", Xml(Think("", "\n</think>\n\n", "</think>\n\n"), **xml_qwen)),
        "qwen3_5_disable_thinking": RendererSpec("qwen3", Xml(None, THINKING_OFF, **xml_qwen)),
        "kimi_k2": RendererSpec("qwen3", Kimi(Think("<think>", "</think>", "<think></think>"))),
        "kimi_k25": RendererSpec("qwen3", Kimi(Think("", "</think>", "</think>"))),
        "kimi_k25_disable_thinking": RendererSpec("qwen3", Kimi(None, THINKING_OFF)),
        "nemotron3": RendererSpec("qwen3", Xml(Think("", "\n</think>\n", "</think>\n"), **xml_nemotron)),
        "nemotron3_disable_thinking": RendererSpec("qwen3", Xml(None, THINKING_OFF, **xml_nemotron)),
    }
    return specs


#: platoon's named renderers -> how they are checked
SPECS: dict[str, RendererSpec] = _specs()


def not_applicable(renderer: str, form: str) -> str | None:
    """Why `form` is not applicable to the named renderer, or None when it is."""
    return SPECS[renderer].writer.not_applicable(form)


def cell_id(renderer: str, dialect: str, form: str) -> str:
    return f"{renderer}-{dialect}-{form}"


# --------------------------------------------------------------------------------------------------------------
# Tokenizers


def tokenizers_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """Where `scripts/fetch_test_tokenizers.py` puts the real tokenizers: `$PLATOON_TEST_TOKENIZERS`, else
    `<root>/.cache/test-tokenizers` (root: the current directory)."""
    env = os.environ.get("PLATOON_TEST_TOKENIZERS")
    return Path(env) if env else Path(root or ".") / ".cache" / "test-tokenizers"


def load_tokenizer(kind: str, directory: str | os.PathLike[str]) -> Any:
    """A tokenizer of `SPECS`: `qwen3`, `llama3`, `deepseek_v3`, `gpt_oss` through platoon's `tokenizers` adapter,
    `qwen3_hf` (Qwen3's, with its chat template) through transformers. Raises FileNotFoundError when missing."""
    names = {
        "qwen3": "Qwen/Qwen3-8B",
        "qwen3_hf": "Qwen/Qwen3-8B",
        "llama3": "meta-llama/Llama-3.1-8B-Instruct",  # its tokenizer: hosted Tinker retired the model itself
        "deepseek_v3": "deepseek-ai/DeepSeek-V3.1",
        "gpt_oss": "openai/gpt-oss-20b",
    }
    if kind not in names:
        raise ValueError(f"unknown tokenizer kind {kind!r}; kinds: {', '.join(names)}")
    sub = "qwen3" if kind == "qwen3_hf" else kind
    path = Path(directory) / sub
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"the {sub} tokenizer is not at {path}: run `uv run python scripts/fetch_test_tokenizers.py` once"
        )
    if kind == "qwen3_hf":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    if kind == "deepseek_v3":  # the package ships no tokenizer_config.json: BOS and EOS are named here
        from tokenizers import Tokenizer

        return TokenizersTokenizer(
            Tokenizer.from_file(str(path / "tokenizer.json")),
            name_or_path=names[kind],
            bos_token=_deepseek("begin▁of▁sentence"),
            eos_token=_deepseek("end▁of▁sentence"),
        )
    return TokenizersTokenizer.from_directory(path, name_or_path=names[kind])


# --------------------------------------------------------------------------------------------------------------
# The policy


class TurnPolicy(ScriptedPolicy):
    """A `ScriptedPolicy` answering queued turns, each ending on its own stop token (gpt-oss ends a call on
    `<|call|>` and an answer on `<|return|>`), or on nothing but the stop text the turn wrote (None)."""

    def __init__(self, tokenizer: Any, stop_token: int) -> None:
        super().__init__(self._next_turn, tokenizer=tokenizer, stop_token=stop_token)
        self.queue: list[tuple[str, End]] = []
        self._text_stop = False

    def _next_turn(self, prompt: str) -> Completion:
        if not self.queue:
            raise AssertionError("the cell's script ran out")
        text, end = self.queue.pop(0)
        self._text_stop = end is None
        if isinstance(end, str):
            ids = self.tokenizer.encode(end, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"the turn's end {end!r} is {len(ids)} tokens of the tokenizer, not one")
            end = ids[0]
        if end is not None:
            self.stop_token = int(end)  # appended by ScriptedPolicy after this returns
        return Completion(text)

    async def sample_async(
        self,
        prompt: Any,
        num_samples: int = 1,
        sampling_params: Any = None,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> tinker.SampleResponse | PlainSample:
        response = await super().sample_async(prompt, num_samples, sampling_params)
        if not self._text_stop:
            return response
        (sequence,) = response.sequences  # a text stop: drop the stop token ScriptedPolicy appended
        return sample_response(sequence.tokens[:-1], stop_reason="stop", logprob=self.logprob)


# --------------------------------------------------------------------------------------------------------------
# The dialects: what each client sends and sends back


#: a tool call as the harness received it: (id, name, arguments as a JSON string or an object)
Received = tuple[str, str, Any]


class _Conversation:
    """One agent's conversation through one dialect: `ask` makes a model call and keeps the reply as the client
    would; `results` and `user` add the next turn."""

    def __init__(self, bench: Bench, agent: AgentRecord, user: str) -> None:
        self.bench = bench
        self.agent = agent
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user},
        ]

    async def ask(self) -> list[Received]:
        raise NotImplementedError

    def results(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        for call_id, text in zip(ids, texts, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


def _openai_calls(calls: Iterable[Mapping[str, Any]] | None) -> list[Received]:
    return [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls or ()]


class _InProcess(_Conversation):
    async def ask(self) -> list[Received]:
        reply = await self.bench.gateway.chat(self.agent, self.messages, tools=self.bench.openai_tools)
        self.messages.append(dict(reply.message))
        return _openai_calls(reply.message.get("tool_calls"))


class _Chat(_Conversation):
    stream = False

    async def ask(self) -> list[Received]:
        client = self.bench.openai_client(self.agent)
        kwargs: dict[str, Any] = {"model": MODEL, "messages": self.messages}
        if self.bench.openai_tools:
            kwargs["tools"] = self.bench.openai_tools
        if not self.stream:
            response = await client.chat.completions.create(**kwargs)
            message = response.choices[0].message.to_dict()  # as the server sent it, extra fields included
        else:
            message = await self._streamed(client, kwargs)
        self.messages.append(message)
        return _openai_calls(message.get("tool_calls"))

    @staticmethod
    async def _streamed(client: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The message a streaming client puts together from the deltas."""
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        stream = await client.chat.completions.create(**kwargs, stream=True)
        async for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    content.append(delta.content)
                extra = delta.model_extra or {}
                if extra.get("reasoning_content"):
                    reasoning.append(extra["reasoning_content"])
                for part in delta.tool_calls or ():
                    slot = calls.setdefault(
                        part.index,
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    slot["id"] = part.id or slot["id"]
                    if part.function is not None:
                        slot["function"]["name"] += part.function.name or ""
                        slot["function"]["arguments"] += part.function.arguments or ""
        text = "".join(content)
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message


class _ChatStream(_Chat):
    stream = True


class _Responses(_Conversation):
    def __init__(self, bench: Bench, agent: AgentRecord, user: str) -> None:
        super().__init__(bench, agent, user)
        self.items: list[dict[str, Any]] = [{"role": "user", "content": user}]

    async def ask(self) -> list[Received]:
        client = self.bench.openai_client(self.agent)
        kwargs: dict[str, Any] = {"model": MODEL, "instructions": SYSTEM, "input": self.items}
        if self.bench.openai_tools:
            kwargs["tools"] = [{"type": "function", **TOOL}]
        response = await client.responses.create(**kwargs)
        output = [item.to_dict() for item in response.output]  # sent back as returned, as Codex does
        self.items.extend(output)
        return [(i["call_id"], i["name"], i["arguments"]) for i in output if i["type"] == "function_call"]

    def results(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        for call_id, text in zip(ids, texts, strict=True):
            self.items.append({"type": "function_call_output", "call_id": call_id, "output": text})

    def user(self, text: str) -> None:
        self.items.append({"role": "user", "content": text})


class _Anthropic(_Conversation):
    def __init__(self, bench: Bench, agent: AgentRecord, user: str) -> None:
        super().__init__(bench, agent, user)
        self.messages = [{"role": "user", "content": user}]

    async def ask(self) -> list[Received]:
        client = self.bench.anthropic_client(self.agent)
        kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 1024, "system": SYSTEM}
        if self.bench.openai_tools:
            kwargs["tools"] = [
                {"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}
            ]
        message = await client.messages.create(messages=self.messages, **kwargs)
        blocks = [block.to_dict() for block in message.content]
        self.messages.append({"role": "assistant", "content": blocks})
        return [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]

    def results(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        blocks = [
            {"type": "tool_result", "tool_use_id": call_id, "content": text}
            for call_id, text in zip(ids, texts, strict=True)
        ]
        self.messages.append({"role": "user", "content": blocks})


_CONVERSATIONS: dict[str, type[_Conversation]] = {
    "inproc": _InProcess,
    "chat": _Chat,
    "chat_stream": _ChatStream,
    "responses": _Responses,
    "anthropic": _Anthropic,
}
#: the client library each HTTP dialect is driven with (not dependencies of platoon: the test group installs them)
_CLIENTS = {"chat": "openai", "chat_stream": "openai", "responses": "openai", "anthropic": "anthropic"}


# --------------------------------------------------------------------------------------------------------------
# A cell and its verdict


@dataclass
class CellResult:
    """A cell's verdict: `extends`, `segment` (with the segments' reasons), `broken` (with what broke), `n/a`."""

    renderer: str
    dialect: str
    form: str
    status: str
    reasons: list[str] = field(default_factory=list)
    calls: int = 0

    @property
    def id(self) -> str:
        return cell_id(self.renderer, self.dialect, self.form)

    @property
    def ok(self) -> bool:
        return self.status in ("extends", "segment", "n/a")


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


class Bench:
    """One renderer served once (gateway, HTTP server, clients on a loop of its own) for any number of cells.

    `Bench(renderer, writer)`; `run(dialect, form)` returns a `CellResult`; `close()` stops the server.
    """

    def __init__(self, renderer: Any, writer: Writer, *, name: str | None = None, tools: bool = True) -> None:
        self.name = str(name or getattr(renderer, "name", None) or type(renderer).__name__)
        self.renderer = renderer
        self.writer = writer
        self.tokenizer = renderer.tokenizer
        stops = list(renderer.stop_token_ids())
        self.stop = stops[0] if stops else None
        fallback = self.stop if self.stop is not None else getattr(self.tokenizer, "eos_token_id", None)
        self.policy = TurnPolicy(self.tokenizer, int(fallback or 0))
        self.gateway: ModelGateway = make_gateway(self.policy, renderer=renderer, model_name=MODEL)
        self.tools = tools
        self.openai_tools = [{"type": "function", "function": TOOL}] if tools else None
        self.loop = asyncio.new_event_loop()
        self.server: Any = None
        self.http: Any = None
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        import httpx

        self.server = await GatewayServer(self.gateway).astart()
        # One connection pool per client library, shared by every cell's clients (anthropic has its own httpx).
        self.http = httpx.AsyncClient(timeout=60)
        self.anthropic_http: Any = None

    def openai_client(self, agent: AgentRecord) -> Any:
        import openai

        endpoint = self.server.endpoint(agent)
        return openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, http_client=self.http
        )

    def anthropic_client(self, agent: AgentRecord) -> Any:
        import anthropic

        if self.anthropic_http is None:
            self.anthropic_http = anthropic.DefaultAsyncHttpxClient(timeout=60)
        return anthropic.AsyncAnthropic(
            base_url=f"{self.server.base_url}/s/{agent.secret}",
            api_key=agent.secret,
            max_retries=0,
            http_client=self.anthropic_http,
        )

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def stop() -> None:
            await self.http.aclose()
            if self.anthropic_http is not None:
                await self.anthropic_http.aclose()
            await self.server.astop()

        try:
            self.loop.run_until_complete(stop())
        finally:
            self.loop.close()

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def not_applicable(self, form: str) -> str | None:
        return self.writer.not_applicable(form)

    def run(self, dialect: str, form: str) -> CellResult:
        """Run one cell (an `n/a` result when the form is not applicable)."""
        if dialect not in _CONVERSATIONS:
            raise ValueError(f"unknown dialect {dialect!r}; dialects: {', '.join(DIALECTS)}")
        reason = self.not_applicable(form)
        client = _CLIENTS.get(dialect)
        if reason is None and client is not None and importlib.util.find_spec(client) is None:
            reason = f"the {client} client is not installed (pip install {client})"
        if reason is not None:
            return CellResult(self.name, dialect, form, "n/a", [reason])
        return self.loop.run_until_complete(self._run(dialect, form))

    async def _run(self, dialect: str, form: str) -> CellResult:
        user, turns = script(form, tools=self.tools)
        queue: list[tuple[str, End]] = []
        written = 0
        for turn in turns:
            queue.append(self.writer.write(turn, self.stop, written))
            written += len(turn.calls)
        self.policy.queue = queue
        rollout = self.gateway.open_rollout()
        agent = self.gateway.open_agent(rollout)
        problems: list[str] = []
        conversation = _CONVERSATIONS[dialect](self, agent, user)
        for number, turn in enumerate(turns, 1):
            try:
                received = await conversation.ask()
            except Exception as exc:
                problems.append(f"call {number} failed: {type(exc).__name__}: {str(exc)[:300]}")
                break
            got = [(name, _arguments(args)) for _, name, args in received]
            wrote = [(call.name, dict(call.arguments)) for call in turn.calls]
            if got != wrote:
                problems.append(
                    f"call {number}: the reply's tool calls {got} are not those the model wrote {wrote}"
                )
                break
            if turn.calls:
                conversation.results([call_id for call_id, _, _ in received], turn.results)
            elif turn.then_user is not None:
                conversation.user(turn.then_user)
        self.gateway.release_rollout(rollout)
        return self._verdict(dialect, form, rollout, agent, problems)

    # ---- the checks ----------------------------------------------------------------------------------------

    def _verdict(
        self, dialect: str, form: str, rollout: RolloutRecorder, agent: AgentRecord, problems: list[str]
    ) -> CellResult:
        records = [(call, rollout.interactions[call.call_id]) for call in agent.calls]
        segments: list[list[Any]] = []
        documented: list[str] = []
        for number, (call, interaction) in enumerate(records, 1):
            if not segments:
                segments.append([interaction])
                continue
            previous = segments[-1][-1]
            grown = previous.prompt_tokens + previous.sampled_tokens
            if interaction.prompt_tokens[: len(grown)] == grown:
                segments[-1].append(interaction)
                continue
            segments.append([interaction])
            history = call.generation.get("history") or {}
            reason = history.get("segment") if isinstance(history, Mapping) else None
            if reason in FORMAT_SEGMENTS:
                documented.append(f"call {number} starts a segment: {reason}")
            elif isinstance(reason, str) and reason:
                problems.append(
                    f"call {number} starts a segment ({reason}) though call {number - 1}'s reply was sent back "
                    "as returned: " + self._difference(grown, interaction.prompt_tokens)
                )
            else:
                problems.append(
                    f"call {number} does not extend call {number - 1} and records no segment: "
                    + self._difference(grown, interaction.prompt_tokens)
                )
        problems.extend(self._datum_problems(rollout, agent, segments))
        if problems:
            return CellResult(self.name, dialect, form, "broken", problems, len(records))
        status = "segment" if documented else "extends"
        return CellResult(self.name, dialect, form, status, documented, len(records))

    def _difference(self, grown: Sequence[int], prompt: Sequence[int]) -> str:
        """Where the prompt leaves the previous prompt and completion, as text either side."""
        at = _first_difference(grown, prompt)
        decode = self.tokenizer.decode
        before = str(decode(list(grown[max(0, at - 8) : at])))
        expected = str(decode(list(grown[at : at + 12])))
        got = str(decode(list(prompt[at : at + 12])))
        return f"after {before!r}, the model wrote {expected!r} but the prompt has {got!r}"

    def _datum_problems(
        self, rollout: RolloutRecorder, agent: AgentRecord, segments: list[list[Any]]
    ) -> list[str]:
        """The trainer's datums: one per segment, the segment's tokens, mask 1 on sampled only."""
        if not segments:
            return ["no call was recorded"]

        collection = build_collection(rollout, episode_outcome=Outcome("scored", rewards={"reward": 1.0}))
        datums = collection_datums(collection, rollout.interactions, {agent.trajectory_id: 1.0}).datums
        if len(datums) != len(segments):
            return [f"{len(datums)} datums for {len(segments)} segments"]
        problems = []
        for number, (datum, segment) in enumerate(zip(datums, segments, strict=True), 1):
            last = segment[-1]
            tokens = list(last.prompt_tokens) + list(last.sampled_tokens)
            mask = [0.0] * len(tokens)
            logprobs = [0.0] * len(tokens)
            for interaction in segment:
                start = len(interaction.prompt_tokens)
                end = start + len(interaction.sampled_tokens)
                mask[start:end] = [1.0] * (end - start)
                logprobs[start:end] = [float(x) for x in interaction.logprobs]
            inputs = datum.loss_fn_inputs
            if datum.model_input.to_ints() != tokens[:-1] or list(inputs["target_tokens"].data) != tokens[1:]:
                problems.append(f"datum {number} does not hold the segment's exact tokens")
            elif [float(x) for x in inputs["mask"].data] != mask[1:]:
                problems.append(f"datum {number}: the loss mask is not 1 on the sampled tokens only")
            elif [float(x) for x in inputs["logprobs"].data] != logprobs[1:]:
                problems.append(f"datum {number}: the logprobs are not the sampled ones")
        return problems


# --------------------------------------------------------------------------------------------------------------
# The printed matrix

SYMBOLS = {"extends": "✓", "segment": "S", "broken": "✗", "n/a": "-"}
_SHORT = {
    "plain": "pl",
    "tool_calls": "tc",
    "parallel_tool_calls": "pa",
    "non_ascii": "na",
    "compact_json": "cj",
    "no_separator": "ns",
    "reasoning": "re",
}


def format_matrix(
    results: Iterable[CellResult],
    *,
    dialects: Sequence[str] = DIALECTS,
    forms: Sequence[str] = FORMS,
    details: bool = True,
) -> str:
    """Renderer rows x dialect/form columns (✓ extends, S segment, ✗ broken, - n/a), then the legend, the
    segments' reasons and what broke, one line per cell."""
    by_cell = {(r.renderer, r.dialect, r.form): r for r in results}
    renderers = list(dict.fromkeys(r for r, _, _ in by_cell))
    width = max([len("renderer"), *(len(r) for r in renderers)])
    block = len(forms) * 3 - 1
    head1 = " " * width + " | " + " | ".join(d.center(block)[:block] for d in dialects)
    head2 = (
        "renderer".ljust(width)
        + " | "
        + " | ".join(" ".join(_SHORT.get(f, f[:2]) for f in forms) for _ in dialects)
    )
    lines = [head1, head2, "-" * len(head2)]
    for renderer in renderers:
        cells = []
        for dialect in dialects:
            marks = []
            for form in forms:
                result = by_cell.get((renderer, dialect, form))
                marks.append((SYMBOLS.get(result.status, "?") if result else " ").center(2))
            cells.append(" ".join(marks))
        lines.append(renderer.ljust(width) + " | " + " | ".join(cells))
    counts = {status: sum(1 for r in by_cell.values() if r.status == status) for status in SYMBOLS}
    lines.append("")
    lines.append(
        "✓ extends  S segment (documented)  ✗ broken  - n/a    "
        + "  ".join(f"{_SHORT.get(f, f)}={f}" for f in forms)
    )
    lines.append("cells: " + ", ".join(f"{SYMBOLS[s]} {n}" for s, n in counts.items()))
    if details:
        for status, title in (("segment", "segments"), ("broken", "broken"), ("n/a", "not applicable")):
            chosen = [r for r in by_cell.values() if r.status == status]
            if not chosen:
                continue
            lines.append("")
            lines.append(f"{title}:")
            if status == "n/a":  # one line per renderer and reason, not per cell
                seen: dict[tuple[str, str], list[str]] = {}
                for r in chosen:
                    seen.setdefault((r.renderer, "; ".join(r.reasons)), []).append(r.form)
                for (renderer, reason), found in seen.items():
                    lines.append(f"  {renderer} {','.join(dict.fromkeys(found))}: {reason}")
                continue
            for r in chosen:
                lines.append(f"  {r.id}: " + " | ".join(r.reasons))
    return "\n".join(lines)


def run_matrix(
    benches: Callable[[str], Bench],
    renderers: Iterable[str],
    *,
    dialects: Sequence[str] = DIALECTS,
    forms: Sequence[str] = FORMS,
    on_result: Callable[[CellResult], None] | None = None,
) -> list[CellResult]:
    """Every cell of `renderers` (a `Bench` made by `benches(name)` and closed after its cells)."""
    results = []
    for name in renderers:
        with benches(name) as bench:
            for dialect in dialects:
                for form in forms:
                    result = bench.run(dialect, form)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
    return results
