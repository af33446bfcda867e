"""The renderer and tokenizer registries: names, custom factories, renderer_kwargs, lookup order."""

from __future__ import annotations

import re
from typing import Any

import pytest

from platoon.errors import ConfigError
from platoon.renderers import (
    Renderer,
    get_renderer,
    get_tokenizer,
    register_renderer,
    register_tokenizer,
    renderer_names,
    unregister_renderer,
    unregister_tokenizer,
)
from platoon.renderers import tokenizers as tokenizer_module
from platoon.renderers.qwen3 import Qwen3InstructRenderer
from platoon.testing import toy_tokenizer


def test_builtin_names():
    assert {"qwen3", "qwen3_instruct", "qwen3_disable_thinking", "qwen3_vl", "qwen3_vl_instruct"} <= set(
        renderer_names()
    )
    renderer = get_renderer("qwen3_vl", toy_tokenizer(), image_processor="ip")
    assert renderer.image_processor == "ip" and renderer.name == "qwen3_vl"  # type: ignore[attr-defined]


def test_unknown_renderer_is_a_config_error():
    with pytest.raises(ConfigError, match=r"unknown renderer 'nope'.*qwen3_instruct") as caught:
        get_renderer("nope", toy_tokenizer())
    assert isinstance(caught.value, ValueError)


def test_renderer_kwargs_set_attributes():
    renderer = get_renderer("qwen3", toy_tokenizer(), renderer_kwargs={"strip_thinking_from_history": False})
    assert renderer.strip_thinking_from_history is False  # type: ignore[attr-defined]
    assert renderer.has_extension_property
    with pytest.raises(ValueError, match="no attribute 'enable_thinking'"):
        get_renderer("qwen3", toy_tokenizer(), renderer_kwargs={"enable_thinking": False})


def test_custom_renderer_factories_take_the_tokenizer_and_the_image_processor():
    seen: list[Any] = []

    def two(tokenizer: Any, image_processor: Any) -> Renderer:
        seen.append(image_processor)
        return Qwen3InstructRenderer(tokenizer)

    register_renderer("acme/two", two)
    register_renderer("acme/one", Qwen3InstructRenderer)
    register_renderer("qwen3", lambda tok, ip=None: Qwen3InstructRenderer(tok))  # registered names come first
    try:
        assert get_renderer("acme/two", toy_tokenizer(), "proc").name == "acme/two" and seen == ["proc"]
        assert isinstance(get_renderer("acme/one", toy_tokenizer()), Qwen3InstructRenderer)
        assert type(get_renderer("qwen3", toy_tokenizer())) is Qwen3InstructRenderer
        assert renderer_names()[:3] == ["acme/two", "acme/one", "qwen3"]
    finally:
        assert (
            unregister_renderer("acme/two")
            and unregister_renderer("acme/one")
            and unregister_renderer("qwen3")
        )
    assert not unregister_renderer("acme/two")
    assert type(get_renderer("qwen3", toy_tokenizer())).__name__ == "Qwen3Renderer"
    with pytest.raises(TypeError):
        register_renderer("bad", "not callable")  # type: ignore[arg-type]


def test_tokenizer_registry_comes_first(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []

    def fake_hf(name: str) -> str:
        calls.append(name)
        return f"hf:{name}"

    monkeypatch.setattr(tokenizer_module, "_load_hf_tokenizer", fake_hf)
    sentinel = object()
    register_tokenizer("acme/tok", lambda: sentinel)
    try:
        assert get_tokenizer("acme/tok") is sentinel
        assert get_tokenizer("Qwen/Qwen3-8B") == "hf:Qwen/Qwen3-8B" and calls == ["Qwen/Qwen3-8B"]
        assert get_tokenizer("platoon/toy") is toy_tokenizer()
    finally:
        assert unregister_tokenizer("acme/tok")
    assert not unregister_tokenizer("acme/tok")


def test_llama3_remap(monkeypatch: pytest.MonkeyPatch):
    import transformers

    loaded: list[tuple[str, dict[str, Any]]] = []

    def fake_from_pretrained(name: str, **kwargs: Any) -> str:
        loaded.append((name, kwargs))
        return name

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_from_pretrained)
    tokenizer_module._load_hf_tokenizer_once.cache_clear()
    try:
        assert get_tokenizer("meta-llama/Llama-3.1-8B-Instruct") == tokenizer_module.LLAMA3_TOKENIZER
        assert get_tokenizer("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    finally:
        tokenizer_module._load_hf_tokenizer_once.cache_clear()
    assert loaded == [
        (tokenizer_module.LLAMA3_TOKENIZER, {"use_fast": True}),
        ("Qwen/Qwen3-8B", {"use_fast": True}),
    ]


def test_im_end_must_be_one_token():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from platoon.renderers import RendererError, TokenizersTokenizer

    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    plain = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    plain.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    renderer = get_renderer("qwen3", TokenizersTokenizer(plain, name_or_path="plain"))
    with pytest.raises(RendererError, match=re.escape("<|im_end|> to be one token in 'plain'")):
        renderer.get_stop_sequences()


def test_a_hugging_face_tokenizer_loads_from_several_threads_at_once_in_a_fresh_process(qwen3_tokenizer_dir):
    """transformers imports its tokenizer modules lazily, and two threads importing them at once made the second
    fail with "cannot import name 'AutoTokenizer'": the local server builds base models on worker threads."""
    import subprocess
    import sys

    script = (
        "import sys, concurrent.futures as futures\n"
        "from platoon.renderers.tokenizers import get_tokenizer\n"
        "with futures.ThreadPoolExecutor(4) as pool:\n"
        "    loaded = list(pool.map(lambda _: get_tokenizer(sys.argv[1]), range(4)))\n"
        "print(len({id(tokenizer) for tokenizer in loaded}), loaded[0].encode('hello world', add_special_tokens=False))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(qwen3_tokenizer_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "1"  # one load, shared by the four threads
    assert done.stdout.strip().endswith("[14990, 1879]")
