"""Print the token-exactness conformance matrix: every named renderer x dialect x form (issue 17).

Each cell is a multi-turn conversation through the real gateway and clients (platoon.testing.conformance); the
same cells run as tests in tests/core/conformance. Needs the test tokenizers:
`uv run python scripts/fetch_test_tokenizers.py` once.

    uv run python scripts/conformance_matrix.py                      # every renderer
    uv run python scripts/conformance_matrix.py qwen3 qwen3_instruct # some
    uv run python scripts/conformance_matrix.py --dialect chat --form compact_json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    from platoon.renderers import get_renderer
    from platoon.testing import conformance as cf

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("renderers", nargs="*", help="renderer names (default: every one in SPECS)")
    parser.add_argument("--dialect", action="append", choices=cf.DIALECTS, help="only these dialects")
    parser.add_argument("--form", action="append", choices=cf.FORMS, help="only these forms")
    parser.add_argument("--brief", action="store_true", help="the table only, without the reasons")
    parser.add_argument(
        "--plain-render",
        action="store_true",
        help="render every prompt whole (renderer_kwargs token_in_history: false, platoon 0.2.0's behaviour)",
    )
    args = parser.parse_args(argv)
    names = args.renderers or list(cf.SPECS)
    unknown = [n for n in names if n not in cf.SPECS]
    if unknown:
        print(f"unknown renderer(s): {', '.join(unknown)}; known: {', '.join(cf.SPECS)}", file=sys.stderr)
        return 2
    directory = cf.tokenizers_dir(ROOT)
    tokenizers: dict[str, Any] = {}

    def bench(name: str) -> cf.Bench:
        spec = cf.SPECS[name]
        if spec.tokenizer not in tokenizers:
            tokenizers[spec.tokenizer] = cf.load_tokenizer(spec.tokenizer, directory)
        kwargs = {"token_in_history": False} if args.plain_render else None
        renderer = get_renderer(name, tokenizers[spec.tokenizer], renderer_kwargs=kwargs)
        return cf.Bench(renderer, spec.writer, name=name, tools=spec.tools)

    started = time.perf_counter()
    try:
        results = cf.run_matrix(
            bench, names, dialects=args.dialect or cf.DIALECTS, forms=args.form or cf.FORMS
        )
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        cf.format_matrix(
            results, dialects=args.dialect or cf.DIALECTS, forms=args.form or cf.FORMS, details=not args.brief
        )
    )
    calls = sum(r.calls for r in results)
    print(f"\n{len(results)} cells, {calls} model calls in {time.perf_counter() - started:.1f} s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
