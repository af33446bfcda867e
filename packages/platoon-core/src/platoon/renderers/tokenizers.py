"""platoon's tokenizer loading: its registry, a local directory, the Llama-3 remap, AutoTokenizer.

`platoon/toy` is registered and loads through `tokenizers` alone, never importing transformers;
`TokenizersTokenizer` is the small adapter that gives a `tokenizers.Tokenizer` the interface renderers use.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platoon.errors import PlatoonError
from platoon.extras import installed

if TYPE_CHECKING:
    import tokenizers

#: factory() -> tokenizer
TokenizerFactory = Callable[[], Any]

#: Texts this long are tokenized with the GIL released (`encode_long`). `tokenizers.Tokenizer.encode` holds the GIL
#: throughout: seconds for a few megabytes, during which no other thread runs, the gateway's event loop included;
#: `encode_batch_fast` releases it while it tokenizes and skips the character offsets nobody here reads. Shorter
#: texts take `encode`, cheaper per call (at most ~15 ms of held GIL for 8 Ki characters of base64).
LONG_TEXT_CHARS = 8192

_REGISTRY: dict[str, TokenizerFactory] = {}

#: One Hugging Face tokenizer load at a time: transformers' lazily imported modules are not safe to import from two
#: threads at once (the second thread gets "cannot import name 'AutoTokenizer'" while the first is still importing),
#: and the local server builds base models on worker threads.
_HF_LOAD_LOCK = threading.Lock()

LLAMA3_PREFIX = "meta-llama/Llama-3"
LLAMA3_TOKENIZER = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"


def register_tokenizer(name: str, factory: TokenizerFactory) -> None:
    """Make `get_tokenizer(name)` return `factory()` (looked up before any directory or hub name)."""
    if not isinstance(name, str) or not name:
        raise ValueError("a tokenizer name must be a non-empty string")
    if not callable(factory):
        raise TypeError(f"the factory for tokenizer {name!r} is not callable")
    _REGISTRY[name] = factory


def unregister_tokenizer(name: str) -> bool:
    """Remove a registered tokenizer name; False when it was not registered."""
    return _REGISTRY.pop(name, None) is not None


def is_tokenizer_registered(name: str) -> bool:
    return name in _REGISTRY


def registered_tokenizer_names() -> list[str]:
    return list(_REGISTRY)


def tokenizer_available_offline(name: str) -> bool:
    """Whether `name`'s tokenizer loads without the network: registered with platoon, a directory, or in the
    Hugging Face cache (the local server serves such a model without asking the hub)."""
    if is_tokenizer_registered(name) or os.path.isdir(name):
        return True
    repo = LLAMA3_TOKENIZER if name.startswith(LLAMA3_PREFIX) else name
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(
            isinstance(try_to_load_from_cache(repo, file), str)
            for file in ("tokenizer_config.json", "tokenizer.json")
        )
    except Exception:  # no huggingface_hub, or a name that is no repository id: not in the cache either way
        return False


def cached_hub_tokenizers() -> list[str]:
    """The Hugging Face models whose tokenizer is in the cache, sorted (none without huggingface_hub)."""
    try:
        from huggingface_hub import scan_cache_dir

        repos = scan_cache_dir().repos
    except Exception:  # no huggingface_hub, or no cache directory yet
        return []
    return sorted(
        repo.repo_id
        for repo in repos
        if repo.repo_type == "model" and tokenizer_available_offline(repo.repo_id)
    )


def get_tokenizer(name: str) -> Any:
    """The tokenizer for a model name, from the first of these that has it.

    1. platoon's registry (`platoon/toy` is registered); the factory decides about caching.
    2. A local directory: `AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`.
    3. `meta-llama/Llama-3*` is loaded from the ungated `thinkingmachineslabinc/meta-llama-3-instruct-tokenizer`.
    4. `AutoTokenizer.from_pretrained(name, use_fast=True)` (the hub or a seeded Hugging Face cache).
    """
    factory = _REGISTRY.get(name)
    if factory is not None:
        return factory()
    return _load_hf_tokenizer(name)


def _load_hf_tokenizer(name: str) -> Any:
    with _HF_LOAD_LOCK:
        return _load_hf_tokenizer_once(name)


@functools.cache
def _load_hf_tokenizer_once(name: str) -> Any:
    from transformers import AutoTokenizer

    if os.path.isdir(name):
        return AutoTokenizer.from_pretrained(name, use_fast=True, trust_remote_code=True)
    if name.startswith(LLAMA3_PREFIX):
        name = LLAMA3_TOKENIZER
    return AutoTokenizer.from_pretrained(name, use_fast=True)


class TokenizersTokenizer:
    """A `tokenizers.Tokenizer` with the part of the transformers tokenizer interface renderers and samplers use.

    Encoding and decoding are the `tokenizers` library's own (byte-identical to a `PreTrainedTokenizerFast` over
    the same `tokenizer.json` with `clean_up_tokenization_spaces=False`); special-token names come from the
    directory's `tokenizer_config.json`.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        name_or_path: str,
        eos_token: str | None = None,
        pad_token: str | None = None,
        bos_token: str | None = None,
        unk_token: str | None = None,
        model_max_length: int = 1048576,
    ) -> None:
        self._tokenizer = tokenizer
        self.name_or_path = name_or_path
        self.eos_token = eos_token
        self.pad_token = pad_token
        self.bos_token = bos_token
        self.unk_token = unk_token
        self.model_max_length = model_max_length

    @classmethod
    def from_directory(
        cls, directory: str | os.PathLike[str], *, name_or_path: str | None = None
    ) -> TokenizersTokenizer:
        """Load `tokenizer.json` (and the special-token names of `tokenizer_config.json`) from a directory."""
        from tokenizers import Tokenizer

        path = Path(directory)
        config_path = path / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text("utf-8")) if config_path.is_file() else {}
        return cls(
            Tokenizer.from_file(str(path / "tokenizer.json")),
            name_or_path=name_or_path or str(path),
            eos_token=_token_name(config.get("eos_token")),
            pad_token=_token_name(config.get("pad_token")),
            bos_token=_token_name(config.get("bos_token")),
            unk_token=_token_name(config.get("unk_token")),
            model_max_length=int(config.get("model_max_length") or 1048576),
        )

    @property
    def backend_tokenizer(self) -> tokenizers.Tokenizer:
        """The wrapped `tokenizers.Tokenizer` (transformers' name for it)."""
        return self._tokenizer

    # ---- encoding and decoding -----------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        if len(text) >= LONG_TEXT_CHARS:
            return _encode_released(self._tokenizer, text, add_special_tokens)
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: int | Iterable[int], skip_special_tokens: bool = False, **_: Any) -> str:
        if type(token_ids) is list:
            # A list (what the gateway passes, several times a call) goes as it is; the backend takes each item
            # as `int()` would, and one it refuses (a float, a numeric string) is converted below instead.
            try:
                return str(self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))
            except TypeError:
                pass
        ids = [token_ids] if isinstance(token_ids, int) else [int(t) for t in token_ids]
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def batch_decode(
        self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False
    ) -> list[str]:
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    # ---- the vocabulary ------------------------------------------------------------------------------------

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> Any:
        if isinstance(tokens, str):
            return self._tokenizer.token_to_id(tokens)
        return [self._tokenizer.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(int(i)) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab(with_added_tokens=True))

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def vocab_size(self) -> int:
        """The base vocabulary without added tokens (transformers' `vocab_size`)."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=False))

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tokenizer.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def all_special_ids(self) -> list[int]:
        decoder = self._tokenizer.get_added_tokens_decoder()
        return sorted(i for i, token in decoder.items() if token.special)

    @property
    def all_special_tokens(self) -> list[str]:
        decoder = self._tokenizer.get_added_tokens_decoder()
        return [decoder[i].content for i in self.all_special_ids]

    def __repr__(self) -> str:
        return f"TokenizersTokenizer(name_or_path={self.name_or_path!r}, vocab={len(self)})"


def encode_long(tokenizer: Any, text: str) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=False)`, with the GIL released while a `tokenizers` backend
    tokenizes (see `LONG_TEXT_CHARS`): what renderers call for a long text.

    platoon's `TokenizersTokenizer` does this itself. A transformers fast tokenizer releases the GIL too, but then
    turns the result into Python lists of ids, attention mask and offsets with the GIL held (~0.2 s per million
    tokens): its backend is called directly when that gives the same ids, i.e. when the class encodes as
    transformers' own fast tokenizer does and no truncation, padding or special-token splitting is set.
    """
    backend = _plain_backend(tokenizer)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    return _encode_released(backend, text, False)


def _encode_released(backend: Any, text: str, add_special_tokens: bool) -> list[int]:
    batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch  # _fast: tokenizers >= 0.20
    return list(batch([text], add_special_tokens=add_special_tokens)[0].ids)


#: the methods a transformers tokenizer encodes through: a class that overrides one encodes its own way
_ENCODING_METHODS = ("encode", "encode_plus", "_encode_plus", "_batch_encode_plus", "tokenize", "__call__")


def _plain_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer whose `encode(text,
    add_special_tokens=False)` is exactly its backend's encoding; None otherwise."""
    base = _transformers_fast_base(tokenizer.__class__)
    if base is None:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    if bool(getattr(tokenizer, "split_special_tokens", False)) != bool(
        getattr(backend, "encode_special_tokens", False)
    ):
        return None
    return backend


@functools.cache
def _transformers_fast_base(cls: type) -> type | None:
    """transformers' fast tokenizer class (`TokenizersBackend` in 5.x, `PreTrainedTokenizerFast` before) when `cls`
    derives from it without overriding how it encodes; None otherwise (transformers is never imported here)."""
    for base in cls.__mro__:
        if base.__module__.startswith("transformers.") and base.__name__ in (
            "TokenizersBackend",
            "PreTrainedTokenizerFast",
        ):
            same = all(getattr(cls, name, None) is getattr(base, name, None) for name in _ENCODING_METHODS)
            return base if same else None
    return None


def _token_name(value: Any) -> str | None:
    # tokenizer_config.json spells a special token as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# The toy tokenizer is here, below the renderers (`platoon.renderers.toy` re-exports it with the toy renderer).
TOY_MODEL_NAME = "platoon/toy"
TOY_TOKENIZER_DIR = Path(__file__).resolve().parent / "toy_tokenizer"
MISSING_TOKENIZERS = "the toy tokenizer needs the tokenizers package, which is not installed: pip install 'platoon-core[tinker]'"


class ToyTokenizerUnavailable(PlatoonError, ImportError):
    """`tokenizers` is missing (bare platoon-core); the message is one line naming the extra that brings it."""


@functools.cache
def toy_tokenizer() -> TokenizersTokenizer:
    """The toy tokenizer (one shared instance): 265 ids, EOS `<|im_end|>` (258), pad `<|endoftext|>` (256)."""
    if not installed("tokenizers"):
        raise ToyTokenizerUnavailable(MISSING_TOKENIZERS)
    return TokenizersTokenizer.from_directory(TOY_TOKENIZER_DIR, name_or_path=TOY_MODEL_NAME)


register_tokenizer(TOY_MODEL_NAME, toy_tokenizer)
