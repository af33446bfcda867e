"""The scripted policy decodes a prompt that extends an earlier one by decoding only the new tokens, and the text it
gets is, every time, what decoding the whole prompt gives."""

from __future__ import annotations

import random
from typing import Any

import tinker

from platoon.testing import ScriptedPolicy, toy_tokenizer
from platoon.testing.policy import _concatenates

PIECES = [
    "héllo wörld ",
    "日本語のテキスト",
    "<|im_start|>user\n",
    "plain ascii ",
    "emoji 🚀 ",
    " leading space",
]


class CountingTokenizer:
    """The toy tokenizer, counting the tokens it is asked to decode."""

    def __init__(self) -> None:
        self.inner = toy_tokenizer()
        self.backend_tokenizer = self.inner.backend_tokenizer
        self.eos_token_id = self.inner.eos_token_id
        self.decoded = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Any) -> str:
        ids = list(ids)
        self.decoded += len(ids)
        return self.inner.decode(ids)


def _conversation(rng: random.Random, turns: int) -> list[list[int]]:
    """Prompts of one growing conversation, some cut inside a character, as token ids."""
    tokenizer = toy_tokenizer()
    ids: list[int] = []
    prompts = []
    for _ in range(turns):
        ids = ids + tokenizer.encode("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 4))))
        if rng.random() < 0.3:  # a cut inside a multi-byte character (the toy tokenizer is a byte per token)
            ids = ids + tokenizer.encode("é")[:1]
        prompts.append(list(ids))
    return prompts


def test_each_prompt_text_is_the_whole_prompt_decoded_whether_or_not_it_extends_an_earlier_one():
    rng = random.Random(7)
    whole = toy_tokenizer()
    for _ in range(30):
        policy = ScriptedPolicy(lambda prompt: "ok")
        # two conversations interleaved on one policy, and now and then an unrelated prompt
        first, second = _conversation(rng, 6), _conversation(rng, 6)
        prompts = [p for pair in zip(first, second, strict=True) for p in pair] + _conversation(rng, 1)
        for ids in prompts:
            policy.sample(ids)
        assert policy.prompts == [whole.decode(ids) for ids in prompts]


def test_a_prompt_extending_the_last_one_decodes_only_its_new_tokens():
    tokenizer = CountingTokenizer()
    policy = ScriptedPolicy(lambda prompt: "ok", tokenizer=tokenizer)
    base = tokenizer.encode("<|im_start|>user\nGuess a number.<|im_end|>\n")
    turn = tokenizer.encode("<|im_start|>assistant\n")
    policy.sample(tinker.ModelInput.from_ints(base))
    decoded = tokenizer.decoded
    policy.sample(tinker.ModelInput.from_ints(base + turn))
    assert tokenizer.decoded - decoded == len(turn)
    assert policy.calls[-1].prompt == toy_tokenizer().decode(base + turn)


def test_a_tokenizer_whose_decoding_does_not_concatenate_decodes_every_prompt_whole():
    class Whole(CountingTokenizer):
        """No backend tokenizer: nothing says its decoding concatenates."""

        def __init__(self) -> None:
            super().__init__()
            del self.backend_tokenizer

    tokenizer = Whole()
    assert not _concatenates(tokenizer) and _concatenates(toy_tokenizer())
    policy = ScriptedPolicy(lambda prompt: "ok", tokenizer=tokenizer)
    ids = tokenizer.encode("one two three")
    policy.sample(ids[:5])
    policy.sample(ids)
    assert tokenizer.decoded == 5 + len(ids)


def test_clean_up_of_the_decoded_text_turns_the_reuse_off():
    tokenizer = CountingTokenizer()
    tokenizer.clean_up_tokenization_spaces = True  # type: ignore[attr-defined]
    assert not _concatenates(tokenizer)


SYSTEM = "<|im_start|>system\nFind the number. Tools: guess(number) — héllo 日本語 🚀<|im_end|>\n<|im_start|>user\n"
# tails that part from each other inside a character too: é and è share their first byte
TAILS = ["é is low", "è is high", "plain 42", "日本", "🚀 up", "", "e"]


def _first_prompts(rng: random.Random, count: int) -> list[list[int]]:
    """First prompts of separate episodes: a long shared start (sometimes cut short, sometimes another one), then
    a tail of their own."""
    tokenizer = toy_tokenizer()
    start = tokenizer.encode(SYSTEM)
    other = tokenizer.encode("<|im_start|>system\nAnother game entirely, with its own long system prompt.\n")
    prompts = []
    for _ in range(count):
        head = other if rng.random() < 0.2 else start
        if rng.random() < 0.2:
            head = head[: rng.randint(1, len(head))]  # cut anywhere, inside a character too
        prompts.append(head + tokenizer.encode(rng.choice(TAILS) + rng.choice(TAILS)))
    return prompts


def test_first_prompts_of_new_policies_are_each_the_whole_prompt_decoded():
    rng = random.Random(11)
    whole = toy_tokenizer()
    for ids in _first_prompts(rng, 300):
        policy = ScriptedPolicy(lambda prompt: "ok")  # an episode's own policy: no earlier call to extend
        policy.sample(ids)
        assert policy.prompts == [whole.decode(ids)]


def test_a_first_prompt_sharing_the_start_of_earlier_episodes_decodes_only_its_own_tail():
    tokenizer = CountingTokenizer()
    start = tokenizer.encode(SYSTEM)
    tails = [tokenizer.encode(f"Guess between 1 and {n}.") for n in (10, 200, 3000)]
    for tail in tails[:2]:
        ScriptedPolicy(lambda prompt: "ok", tokenizer=tokenizer).sample(start + tail)
    decoded = tokenizer.decoded
    policy = ScriptedPolicy(lambda prompt: "ok", tokenizer=tokenizer)
    policy.sample(start + tails[2])
    assert policy.prompts == [toy_tokenizer().decode(start + tails[2])]
    assert tokenizer.decoded - decoded < len(start)
