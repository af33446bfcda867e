"""The fixtures of platoon's opt-in pytest plugin: `toy_tokenizer`, `toy_renderer`, `serve_policy`.

Loaded by `pytest -p platoon.testing` (or `pytest_plugins = ["platoon.testing"]`) through that package's
`pytest_plugins`; importing it needs pytest, which platoon.testing itself does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from platoon.renderers.toy import toy_renderer, toy_tokenizer
from platoon.testing.gateway import serve_policy


@pytest.fixture(scope="session", name="toy_tokenizer")
def _toy_tokenizer_fixture() -> Any:
    """The toy tokenizer."""
    return toy_tokenizer()


@pytest.fixture(scope="session", name="toy_renderer")
def _toy_renderer_fixture() -> Any:
    """The default toy renderer (`qwen3_instruct` over the toy tokenizer)."""
    return toy_renderer()


@pytest.fixture(name="serve_policy")
def _serve_policy_fixture() -> Iterator[Callable[..., Any]]:
    """A factory `serve_policy(policy=(), **options)` whose policy stays served until the test ends.

    Each call enters `platoon.testing.serve_policy` (imported on first call) and yields its `ScriptedPolicy`.
    """
    with contextlib.ExitStack() as stack:

        def serve(policy: Any = (), **options: Any) -> Any:
            return stack.enter_context(serve_policy(policy, **options))

        yield serve
