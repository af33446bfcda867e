"""How the tool-call parsers scale on degenerate text (a model repeating a marker): time per parse as the text grows.

Run from the workspace root: `uv run --frozen python benchmarks/tool_parsers.py [--sizes 5000,10000,20000,40000]`.
Each row is one parser on one repeated pattern; the columns are the best of `--runs` parses at each number of
repetitions, then the ratio of the largest time to the smallest over the ratio of the sizes (about 1 for linear
time, about the size ratio for quadratic time). A clean response with calls is timed too, for scale.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from platoon.renderers.tool_parsers import get_parser

DS_CALL = "<\uff5ctool\u2581call\u2581begin\uff5c>"

#: (parser, the repeated pattern, what it stresses)
CASES: list[tuple[str, str, str]] = [
    ("qwen3_coder", "<parameter=k>\n", "parameters that never close"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx\n", "calls that never close"),
    ("hermes", "<tool_call>{", "blocks that never close"),
    ("glm45", "<tool_call>f<arg_key>k</arg_key><arg_value>", "values that never close"),
    ("llama3", '{"name": ', "objects that never close"),
    ("llama3", '{"a": x ', "objects that fail to decode"),
    ("llama3", '{"name": "f", "parameters": {}} x ', "calls among prose"),
    ("mistral", "[TOOL_CALLS]{", "markers with broken JSON"),
    ("mistral", '[TOOL_CALLS]f{"a": "', "names with unclosed strings"),
    ("deepseekv31", DS_CALL, "calls that never close"),
    ("kimi_k2", "<|tool_call_begin|>", "calls that never close"),
    ("gpt-oss", "<|channel|>final<|message|>x", "messages that never end"),
    ("pythonic", "[f(a=1), ", "nested lists"),
]


def best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,10000,20000,40000", help="repetitions of the pattern")
    parser.add_argument("--runs", type=int, default=3, help="parses per size; the best is shown (default 3)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    head = f"{'parser':<12} {'pattern':<30}" + "".join(f"{n:>10}" for n in sizes) + "   growth"
    print(head)
    print("-" * len(head))
    for name, pattern, what in CASES:
        parse = get_parser(name).parse
        texts = [pattern * n for n in sizes]
        times = [best_of(args.runs, lambda t=t, p=parse: p(t)) for t in texts]
        growth = (times[-1] / max(times[0], 1e-9)) / (sizes[-1] / sizes[0])
        cells = "".join(f"{t * 1000:>8.1f}ms" for t in times)
        print(f"{name:<12} {what:<30}{cells}   {growth:5.2f}")
    clean = (
        "Let me check.\n<tool_call>\n"
        + '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
        + "\n</tool_call>"
    ) * 4
    hermes = get_parser("hermes").parse
    print(
        f"\nhermes, a clean reply with 4 calls: {best_of(200, lambda: hermes(clean)) * 1e6:.0f} us per parse"
    )


if __name__ == "__main__":
    main()
