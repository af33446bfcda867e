"""The token-exactness conformance matrix (issue 17): every named renderer x dialect x form.

Each cell is a multi-turn conversation through the real gateway and clients (`platoon.testing.conformance`): every
recorded call's prompt extends the previous prompt and its sampled tokens, or starts a segment for a reason of the
chat format (`FORMAT_SEGMENTS`); the trainer's datums hold exactly the sampled tokens, mask 1 on them only, one
datum per segment. `scripts/conformance_matrix.py` prints the same cells as a table, and the forms a chat format
cannot express (n/a, with the reason), which are not tests.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from platoon.renderers import renderer_names
from platoon.testing.conformance import (
    DIALECTS,
    FORMS,
    SPECS,
    Bench,
    CellResult,
    cell_id,
    format_matrix,
    not_applicable,
)

#: Cells that fail on main today, each with what breaks: strict xfails, so a fix that makes one pass fails the run
#: until its id is taken off this list. Empty it as the fixes land; add nothing here without an issue.
KNOWN_FAILING: dict[str, str] = {}


def _cells() -> list[object]:
    """Every applicable cell (a form the chat format cannot express is not a test: the script lists those)."""
    cells = []
    for renderer in SPECS:
        for dialect in DIALECTS:
            for form in FORMS:
                if not_applicable(renderer, form) is not None:
                    continue
                ident = cell_id(renderer, dialect, form)
                marks = []
                if ident in KNOWN_FAILING:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[ident]))
                cells.append(pytest.param(renderer, dialect, form, id=ident, marks=marks))
    return cells


# The OpenAI and Anthropic dialects carry no function name on a tool result; gpt-oss warns about it on each render.
@pytest.mark.filterwarnings("ignore:Tool message missing 'name' field")
@pytest.mark.parametrize(("renderer", "dialect", "form"), _cells())
def test_cell(bench_for: Callable[[str], Bench], renderer: str, dialect: str, form: str) -> None:
    result = bench_for(renderer).run(dialect, form)
    assert result.status in ("extends", "segment"), "\n".join(result.reasons)


def test_every_renderer_is_in_the_matrix() -> None:
    assert sorted(set(renderer_names()) - set(SPECS)) == []


def test_a_form_is_left_out_only_where_the_chat_format_cannot_express_it() -> None:
    left_out = {
        (r, f): not_applicable(r, f) for r in SPECS for f in FORMS if not_applicable(r, f) is not None
    }
    # Plain conversations and tool calls in every format that has tools are always cells.
    assert not any(form == "plain" for _, form in left_out)
    assert all(reason for reason in left_out.values())


def test_the_known_failing_list_names_runnable_cells() -> None:
    runnable = {
        cell_id(r, d, f) for r in SPECS for d in DIALECTS for f in FORMS if not_applicable(r, f) is None
    }
    assert sorted(set(KNOWN_FAILING) - runnable) == []


def test_a_prompt_that_does_not_extend_breaks_the_cell(
    conformance_tokenizers: Callable[[str], object],
) -> None:
    # Rendered whole, a gpt-oss answer's sampled <|return|> is written <|end|> in history: the check must see it.
    from platoon.renderers import get_renderer

    name = "gpt_oss_low_reasoning"
    spec = SPECS[name]
    tokenizer = conformance_tokenizers(spec.tokenizer)
    renderer = get_renderer(name, tokenizer, renderer_kwargs={"token_in_history": False})
    with Bench(renderer, spec.writer, name=name) as bench:
        result = bench.run("inproc", "plain")
    assert result.status == "broken" and result.calls == 3
    assert "call 2 starts a segment (opted_out)" in result.reasons[0]
    assert "<|return|>" in result.reasons[0] and "<|end|>" in result.reasons[0]


def test_the_printed_matrix() -> None:
    results = [
        CellResult("r1", "chat", "plain", "extends"),
        CellResult("r1", "chat", "reasoning", "segment", ["call 3 starts a segment: reasoning_dropped"]),
        CellResult("r2", "chat", "plain", "broken", ["call 2 does not extend call 1"]),
        CellResult("r2", "chat", "reasoning", "n/a", ["no reasoning"]),
    ]
    text = format_matrix(results, dialects=["chat"], forms=["plain", "reasoning"])
    rows = text.splitlines()
    assert rows[1].split() == ["renderer", "|", "pl", "re"]
    assert rows[3].split() == ["r1", "|", "✓", "S"] and rows[4].split() == ["r2", "|", "✗", "-"]
    assert "  r1-chat-reasoning: call 3 starts a segment: reasoning_dropped" in rows
    assert "  r2-chat-plain: call 2 does not extend call 1" in rows
    assert "  r2 reasoning: no reasoning" in rows
