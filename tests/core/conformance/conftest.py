"""Fixtures for the conformance matrix: the real tokenizers (fetched once by `scripts/fetch_test_tokenizers.py`)
and one served renderer at a time (a `Bench`: gateway, HTTP server and clients built once for all its cells)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from platoon.testing.conformance import SPECS, Bench, load_tokenizer, tokenizers_dir

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def conformance_tokenizers() -> Callable[[str], Any]:
    """kind -> the tokenizer (`load_tokenizer`), each loaded once."""
    directory = tokenizers_dir(ROOT)
    loaded: dict[str, Any] = {}

    def tokenizer(kind: str) -> Any:
        if kind not in loaded:
            try:
                loaded[kind] = load_tokenizer(kind, directory)
            except FileNotFoundError as exc:
                pytest.fail(str(exc), pytrace=False)
        return loaded[kind]

    return tokenizer


@pytest.fixture(scope="module")
def bench_for(conformance_tokenizers: Callable[[str], Any]) -> Iterator[Callable[[str], Bench]]:
    """renderer name -> its `Bench`; the cells of one renderer run together, so only the latest is kept open."""
    from platoon.renderers import get_renderer

    current: list[Bench] = []

    def bench(name: str) -> Bench:
        if current and current[0].name == name:
            return current[0]
        while current:
            current.pop().close()
        spec = SPECS[name]
        renderer = get_renderer(name, conformance_tokenizers(spec.tokenizer))
        current.append(Bench(renderer, spec.writer, name=name, tools=spec.tools))
        return current[0]

    yield bench
    while current:
        current.pop().close()
