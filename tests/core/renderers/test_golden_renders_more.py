"""platoon's renderers reproduce tinker-cookbook 0.3.0's renders token for token (testdata/renders).

The generic checks run for EVERY `written` pair of index.json (every renderer name over the tokenizers its goldens
used): prompts, supervised examples, errors and warnings as data, tool prefixes, parses, stop sequences and the
gateway adapter's rendering of the OpenAI conversation. The family checks here (role_colon, llama3, deepseekv3*,
gpt_oss_*) add round trips and the prefix property; the other families' are beside this file.
"""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import pytest

from platoon.renderers import RendererError, get_renderer, message_to_jsonable
from platoon.testing import toy_tokenizer

from .test_golden_renders import renders_dir

RENDERERS = [
    "role_colon",
    "llama3",
    "deepseekv3",
    "deepseekv3_disable_thinking",
    "deepseekv3_thinking",
    "gpt_oss_no_sysprompt",
    "gpt_oss_low_reasoning",
    "gpt_oss_medium_reasoning",
    "gpt_oss_high_reasoning",
]
#: golden tokenizer name -> the conftest fixture that loads it (None: the toy tokenizer)
FIXTURES = {
    "toy": None,
    "qwen3": "qwen3_tokenizer",
    "llama3": "llama3_tokenizer",
    "deepseek_v3": "deepseek_v3_tokenizer",
    "gpt_oss": "gpt_oss_tokenizer",
}
#: families whose renderers parse tool calls themselves
TOOL_CALL_RENDERERS = [n for n in RENDERERS if n.startswith(("deepseekv3", "gpt_oss"))]


@cache
def index() -> dict[str, Any]:
    return json.loads((renders_dir() / "index.json").read_text("utf-8"))


@cache
def golden(renderer: str, tokenizer: str) -> dict[str, Any]:
    return json.loads((renders_dir() / f"{renderer}--{tokenizer}.json").read_text("utf-8"))


def written_pairs() -> list[tuple[str, str]]:
    return [
        (p["renderer"], p["tokenizer"])
        for p in index()["pairs"]
        if p["renderer"] in RENDERERS and p["status"] == "written"
    ]


def all_written_pairs() -> list[tuple[str, str]]:
    """Every renderer over every tokenizer the goldens were written for: the generic checks below cover them all."""
    return [(p["renderer"], p["tokenizer"]) for p in index()["pairs"] if p["status"] == "written"]


def _case_params(kind: str) -> list[Any]:
    out = []
    for name, tok in all_written_pairs():
        for item in golden(name, tok)["cases" if kind == "cases" else "extra_parses"]:
            key = item["id"] if kind == "cases" else item["name"]
            out.append(pytest.param(name, tok, key, id=f"{tok}/{name}/{key}"))
    return out


@pytest.fixture
def tokenizer_for(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    def get(tok: str) -> Any:
        fixture = FIXTURES[tok]
        return toy_tokenizer() if fixture is None else request.getfixturevalue(fixture)

    return get


def make_renderer(name: str, tok: str, tokenizer: Any) -> Any:
    """The renderer as the goldens built it: `get_renderer`, then the recorded attributes (gpt_oss's date)."""
    return get_renderer(name, tokenizer, renderer_kwargs=golden(name, tok)["renderer_attributes"])


def _case(name: str, tok: str, case_id: str) -> dict[str, Any]:
    return next(c for c in golden(name, tok)["cases"] if c["id"] == case_id)


def _raw_decode(tokenizer: Any, ids: list[int]) -> str:
    # The goldens' `text` fields are decoded without clean-up (llama3's tokenizer cleans up by default).
    return str(tokenizer.decode(ids, clean_up_tokenization_spaces=False))


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module", autouse=True)
def _finalise_earlier_files_objects() -> None:
    """What the test files run before this one in the same process left to the garbage collector is finalised
    once, before any warning is recorded (a full collection per test cost about a second each, 13 minutes in all).
    """
    gc.collect()


@contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    """The distinct warnings raised inside, as `Category: message` (the goldens list each once).

    ResourceWarnings are left out: they come from the garbage collector finalising some earlier test's objects
    (an unclosed socket), whichever test happens to be running, and a renderer never raises one.
    """
    seen: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ResourceWarning)
        yield seen
    for item in caught:
        text = f"{item.category.__name__}: {item.message}"
        if text not in seen:
            seen.append(text)


def _same_parse(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    """Equal, except that an unparsed call's `Invalid JSON:` error is compared by that prefix only (README)."""
    actual, expected = json.loads(json.dumps(actual)), json.loads(json.dumps(expected))
    for message in (actual, expected):
        for unparsed in message.get("unparsed_tool_calls", []):
            if unparsed["error"].startswith("Invalid JSON:"):
                unparsed["error"] = "Invalid JSON:"
    assert actual == expected


def _check_parse(renderer: Any, tokenizer: Any, entry: dict[str, Any]) -> None:
    ids = entry["completion_ids"]
    assert tokenizer.encode(entry["completion_text"], add_special_tokens=False) == ids
    if "error" in entry:
        with pytest.raises(RendererError) as caught:
            renderer.parse_response(ids)
        assert _error_text(caught.value) == entry["error"]
        return
    message, ok = renderer.parse_response(ids)
    assert ok is entry["ok"]
    _same_parse(message_to_jsonable(message), entry["parsed"])


# ---- the golden cases ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "tok", "case_id"), _case_params("cases"))
def test_golden_case(name: str, tok: str, case_id: str, tokenizer_for: Callable[[str], Any]) -> None:
    tokenizer = tokenizer_for(tok)
    renderer = make_renderer(name, tok, tokenizer)
    case = _case(name, tok, case_id)
    render_input = case["render_input"]

    prefix = case["tool_prefix"]
    if prefix is not None:
        if "error" in prefix:
            with pytest.raises(NotImplementedError) as not_implemented:
                renderer.create_conversation_prefix_with_tools(prefix["tool_specs"], prefix["system_prompt"])
            # The cookbook's llama3 raises a bare NotImplementedError (recorded as "NotImplementedError: "):
            # platoon's says why; a recorded message must match exactly.
            kind, _, recorded = prefix["error"].partition(": ")
            assert type(not_implemented.value).__name__ == kind
            assert not recorded or str(not_implemented.value) == recorded
        else:
            got = renderer.create_conversation_prefix_with_tools(
                prefix["tool_specs"], prefix["system_prompt"]
            )
            assert got == prefix["messages"]

    with recorded_warnings() as seen:
        expected = case["generation_prompt"]
        if "error" in expected:
            with pytest.raises(RendererError) as caught:
                renderer.build_generation_prompt(render_input[:-1])
            assert _error_text(caught.value) == expected["error"]
        else:
            prompt = renderer.build_generation_prompt(render_input[:-1])
            assert prompt.to_ints() == expected["ids"]
            assert [chunk.length for chunk in prompt.chunks] == expected["chunk_lengths"]
            assert _raw_decode(tokenizer, expected["ids"]) == expected["text"]

        expected = case["supervised_example"]
        if "error" in expected:
            with pytest.raises(RendererError) as caught:
                renderer.build_supervised_example(render_input)
            assert _error_text(caught.value) == expected["error"]
        else:
            model_input, weights = renderer.build_supervised_example(render_input)
            assert model_input.to_ints() == expected["ids"]
            assert weights == [float(w) for w in expected["weights"]]
            assert [chunk.length for chunk in model_input.chunks] == expected["chunk_lengths"]
            assert _raw_decode(tokenizer, expected["ids"]) == expected["text"]
            assert weights.index(1.0) == case["target_completion_start"]
    assert seen == case.get("warnings", [])

    if "prompt_is_prefix_of_supervised" in case:  # recorded where both rendered
        prompt_ids, supervised_ids = case["generation_prompt"]["ids"], case["supervised_example"]["ids"]
        is_prefix = supervised_ids[: len(prompt_ids)] == prompt_ids
        assert is_prefix is case["prompt_is_prefix_of_supervised"]
        plus_target = prompt_ids == supervised_ids[: case["target_completion_start"]]
        assert plus_target is case["prompt_plus_target_equals_supervised"]

    for entry in case["parses"]:
        _check_parse(renderer, tokenizer, entry)


@pytest.mark.parametrize(("name", "tok", "case_id"), _case_params("cases"))
def test_golden_case_through_the_gateway_adapter(
    name: str, tok: str, case_id: str, tokenizer_for: Callable[[str], Any]
) -> None:
    """The OpenAI conversation and tools, converted and folded by `render_prompt`, give the golden prompt (or its
    error); role_colon and llama3 have no tool prefix, so their tools are left out, as in the goldens."""
    renderer = make_renderer(name, tok, tokenizer_for(tok))
    case = _case(name, tok, case_id)
    converted = [message_to_jsonable(m) for m in renderer.to_renderer_messages(case["conversation"])]
    assert converted == case["messages"]
    expected = case["generation_prompt"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # checked in test_golden_case
        if "error" in expected:
            with pytest.raises(RendererError) as caught:
                renderer.render_prompt(case["conversation"][:-1], tools=case["tools"])
            assert _error_text(caught.value) == expected["error"]
        else:
            assert renderer.render_prompt(case["conversation"][:-1], tools=case["tools"]) == expected["ids"]


@pytest.mark.parametrize(("name", "tok", "parse_name"), _case_params("extra_parses"))
def test_golden_extra_parse(
    name: str, tok: str, parse_name: str, tokenizer_for: Callable[[str], Any]
) -> None:
    tokenizer = tokenizer_for(tok)
    entry = next(p for p in golden(name, tok)["extra_parses"] if p["name"] == parse_name)
    _check_parse(make_renderer(name, tok, tokenizer), tokenizer, entry)


@pytest.mark.parametrize(("name", "tok"), [pytest.param(n, t, id=f"{t}/{n}") for n, t in all_written_pairs()])
def test_golden_renderer_properties(name: str, tok: str, tokenizer_for: Callable[[str], Any]) -> None:
    data = golden(name, tok)
    renderer = make_renderer(name, tok, tokenizer_for(tok))
    stops = renderer.get_stop_sequences()
    assert stops == data["stop_sequences"]["values"]
    assert [s if isinstance(s, str) else _raw_decode(renderer.tokenizer, [s]) for s in stops] == data[
        "stop_sequences"
    ]["decoded"]
    # Text stops (role_colon) are not token ids: the gateway adapter gets none and parses the text.
    assert renderer.stop_token_ids() == [s for s in data["stop_sequences"]["values"] if isinstance(s, int)]
    assert renderer.has_extension_property is data["has_extension_property"]
    if "renderer_class" in data:  # the gpt_oss names are small subclasses that fix the reasoning effort
        assert data["renderer_class"] in [cls.__name__ for cls in type(renderer).__mro__]
    for attribute, value in data["renderer_attributes"].items():
        assert getattr(renderer, attribute) == value


def test_every_written_pair_is_covered() -> None:
    """9 renderer names: role_colon over all 5 tokenizers, the others over their own model's tokenizer."""
    pairs = written_pairs()
    assert len(pairs) == 13
    assert {t for n, t in pairs if n == "role_colon"} == set(FIXTURES)
    failing = [p for p in index()["pairs"] if p["renderer"] in RENDERERS and p["status"] == "fails"]
    assert len(failing) == 9 * 5 - 13


@pytest.mark.parametrize("tok", ["llama3", "deepseek_v3", "gpt_oss"])
def test_real_tokenizer_matches_the_index(tok: str, tokenizer_for: Callable[[str], Any]) -> None:
    tokenizer = tokenizer_for(tok)
    recorded = index()["tokenizers"][tok]
    assert tokenizer.eos_token_id == recorded["eos_token_id"]
    assert tokenizer.bos_token_id == recorded["bos_token_id"]
    assert len(tokenizer) == recorded["vocab_size"]
    for example in recorded["encode_examples"]:
        assert tokenizer.encode(example["text"]) == example["ids"]
        assert tokenizer.decode(example["ids"]) == example["decoded"]
    for marker, ids in recorded["marker_encodings"].items():
        assert tokenizer.encode(marker) == ids, marker


# ---- control strings must be single tokens ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "marker"),
    [
        ("llama3", "<|eot_id|>"),
        ("deepseekv3", "<\uff5cend▁of▁sentence\uff5c>"),
        ("deepseekv3_thinking", "<\uff5cend▁of▁sentence\uff5c>"),
        ("gpt_oss_no_sysprompt", "<|return|>"),
        ("gpt_oss_high_reasoning", "<|return|>"),
    ],
)
def test_a_tokenizer_without_the_family_specials_is_refused(name: str, marker: str) -> None:
    """Over the toy tokenizer (Qwen specials only) the control strings are several tokens: a clear error."""
    renderer = get_renderer(name, toy_tokenizer())
    with pytest.raises(RendererError, match="one token") as caught:
        renderer.get_stop_sequences()
    assert marker in str(caught.value)
    with pytest.raises(RendererError, match="one token"):
        renderer.parse_response(toy_tokenizer().encode("Hello"))
    if not name.startswith("gpt_oss"):  # a gpt_oss prompt holds no single-token control string it checks
        with pytest.raises(RendererError, match="one token"):
            renderer.build_generation_prompt([{"role": "user", "content": "hi"}])


def test_llama3_bos_is_checked_too(tokenizer_for: Callable[[str], Any]) -> None:
    renderer = get_renderer("llama3", tokenizer_for("llama3"))
    assert renderer.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints()[0] == 128000


# ---- render -> sample -> parse ---------------------------------------------------------------------------------


def _tool_call_cases() -> list[Any]:
    out = []
    for name, tok in written_pairs():
        if name in TOOL_CALL_RENDERERS:
            for case in golden(name, tok)["cases"]:
                if "tool_calls" in case["conversation"][-1]:
                    out.append(pytest.param(name, tok, case["id"], id=f"{tok}/{name}/{case['id']}"))
    return out


def _sampled_target(renderer: Any, case: dict[str, Any]) -> list[int]:
    """What a model that writes the target message samples: the weight-1 tail of the supervised example, ending on
    a stop token (the cookbook's DeepSeek renderer writes no end-of-sentence after a tool-call turn with empty
    content, but the model stops on one, so it is added)."""
    model_input, weights = renderer.build_supervised_example(case["render_input"])
    ids = model_input.to_ints()
    tail = ids[weights.index(1.0) :]
    if tail[-1] not in renderer.stop_token_ids():
        tail.append(renderer.stop_token_ids()[0])
    return list(tail)


@pytest.mark.parametrize(("name", "tok", "case_id"), _tool_call_cases())
def test_tool_calls_round_trip(
    name: str, tok: str, case_id: str, tokenizer_for: Callable[[str], Any]
) -> None:
    renderer = make_renderer(name, tok, tokenizer_for(tok))
    case = _case(name, tok, case_id)
    expected_calls = case["conversation"][-1]["tool_calls"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompt = renderer.render_prompt(case["conversation"][:-1], tools=case["tools"])
        sample = _sampled_target(renderer, case)
    assert prompt == case["generation_prompt"]["ids"]

    # The cookbook-level parse gives back the calls (Harmony and DeepSeek carry no call ids).
    message, ok = renderer.parse_response(sample)
    assert ok
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message["tool_calls"]]
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in expected_calls]
    # gpt_oss samples stop at the first `<|call|>`: one call per sampled turn.
    assert got == (want[:1] if name.startswith("gpt_oss") else want)

    parsed = renderer.parse_completion(sample, "stop")
    assert parsed.ok and parsed.finish_reason == "tool_calls"
    calls = parsed.message["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == got
    assert all(c["id"].startswith("call_") for c in calls)
    assert parsed.message["content"] == ""
    reasoning = case["conversation"][-1].get("reasoning_content")
    assert parsed.message["reasoning_content"] == (reasoning or None)

    # A length-truncated turn emits no calls; their text is kept in the content.
    truncated = renderer.parse_completion(sample, "length")
    assert truncated.message["tool_calls"] is None and truncated.finish_reason == "length"
    assert got[0][0] in truncated.message["content"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, id=n) for n in TOOL_CALL_RENDERERS if n != "deepseekv3_disable_thinking"]
)
def test_answer_with_reasoning_round_trips_through_the_gateway(
    name: str, tokenizer_for: Callable[[str], Any]
) -> None:
    tok = "gpt_oss" if name.startswith("gpt_oss") else "deepseek_v3"
    renderer = make_renderer(name, tok, tokenizer_for(tok))
    case = _case(name, tok, "reasoning_last")
    sample = _sampled_target(renderer, case)
    parsed = renderer.parse_completion(sample, "stop")
    assert parsed.ok and parsed.finish_reason == "stop" and parsed.message["tool_calls"] is None
    assert parsed.message["content"] == case["conversation"][-1]["content"]
    target = case["conversation"][-1]
    if name == "deepseekv3":  # non-thinking mode drops the reasoning from what it renders
        assert parsed.message["reasoning_content"] is None
    else:
        assert parsed.message["reasoning_content"] == target["reasoning_content"]


def test_deepseek_thinking_prefill_is_restored_for_the_gateway(tokenizer_for: Callable[[str], Any]) -> None:
    """The `<think>` is in the prompt, not the sample; with the V3 vocabulary the cookbook parse leaves the text as
    is (golden `prefilled_thinking`), while the gateway still reads the reasoning."""
    tokenizer = tokenizer_for("deepseek_v3")
    renderer = get_renderer("deepseekv3_thinking", tokenizer)
    sample = tokenizer.encode("Let me think.</think>The answer is 4.<\uff5cend▁of▁sentence\uff5c>")
    parsed = renderer.parse_completion(sample, "stop")
    assert parsed.message["content"] == "The answer is 4."
    assert parsed.message["reasoning_content"] == "Let me think."


def test_role_colon_parses_through_the_gateway_on_its_text_stop(tokenizer_for: Callable[[str], Any]) -> None:
    renderer = get_renderer("role_colon", tokenizer_for("qwen3"))
    sample = renderer.tokenizer.encode(" Paris.\n\nUser:")
    parsed = renderer.parse_completion(sample, "stop")
    assert parsed.ok and parsed.message["content"] == "Paris." and parsed.finish_reason == "stop"


# ---- the multi-turn prefix property ----------------------------------------------------------------------------

#: renderers whose earlier prompts plus completions are not prefixes of later prompts, and why
NO_PREFIX_PROPERTY = {
    # the thinking prompt ends on a `<think>` prefill, while a history turn opens with `</think>` and loses its
    # thinking
    "deepseekv3_thinking",
    # a sampled final answer ends `<|return|>`, the same turn in history ends `<|end|>`
    "gpt_oss_no_sysprompt",
    "gpt_oss_low_reasoning",
    "gpt_oss_medium_reasoning",
    "gpt_oss_high_reasoning",
}


#: (renderer, case) pairs where the cookbook claims the extension property but its rendering breaks it: in
#: non-thinking mode an answer that follows a tool result keeps its thinking as the target, while the same turn in
#: history loses it (kept faithfully, as the cookbook renders it)
KNOWN_BREAKS = {
    ("deepseekv3", "reasoning_tool_call"),
    ("deepseekv3_disable_thinking", "reasoning_tool_call"),
}


def _prefix_params() -> list[Any]:
    out = []
    for name, tok in written_pairs():
        for case in golden(name, tok)["cases"]:
            if "error" not in case["supervised_example"]:
                out.append(pytest.param(name, tok, case["id"], id=f"{tok}/{name}/{case['id']}"))
    return out


@pytest.mark.parametrize(("name", "tok", "case_id"), _prefix_params())
def test_prefix_property(name: str, tok: str, case_id: str, tokenizer_for: Callable[[str], Any]) -> None:
    """For every assistant turn i: prompt(messages[:i]) + the sampled turn is a prefix of the next prompt, where
    the renderer has the extension property; NO_PREFIX_PROPERTY lists where it does not hold (it still holds for
    the prompt alone in gpt_oss, which keeps reasoning in history)."""
    renderer = make_renderer(name, tok, tokenizer_for(tok))
    messages = _case(name, tok, case_id)["render_input"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The next round's prompt: the conversation so far and a new user turn.
        final = renderer.build_generation_prompt(
            [*messages, {"role": "user", "content": "And then?"}]
        ).to_ints()
        holds = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            following = messages[i + 1]["role"] if i + 1 < len(messages) else "user"
            if name == "role_colon" and following != "user":
                continue  # role_colon's turn ends with the `User:` of its stop: only a user turn may follow
            model_input, weights = renderer.build_supervised_example(messages[: i + 1])
            ids = model_input.to_ints()
            turn = ids[weights.index(1.0) :]
            prompt = renderer.build_generation_prompt(messages[:i]).to_ints()
            if name.startswith("gpt_oss"):
                assert final[: len(prompt)] == prompt
            holds.append(final[: len(prompt) + len(turn)] == prompt + turn)
    if name in NO_PREFIX_PROPERTY:
        assert renderer.has_extension_property is False
    elif (name, case_id) in KNOWN_BREAKS:
        assert renderer.has_extension_property is True and not all(holds)
    else:
        assert all(holds)
