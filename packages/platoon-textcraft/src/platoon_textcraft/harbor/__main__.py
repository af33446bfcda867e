"""`python -m platoon_textcraft.harbor export --variant synth --out DIR [...]`: write the Harbor dataset.

Progress (`<split>: <n> tasks`) goes to stderr, the last line (`wrote <n> tasks to <out>`) to stdout. Bad input
is one line on stderr and exit 2 (usage) or 1 (an export that cannot be written).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon_textcraft.harbor", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write TextCraft-Synth (or TextCraft) as a Harbor dataset")
    export.add_argument("--variant", choices=("synth", "original"), default="synth")
    export.add_argument("--out", required=True, help="a new directory (see --force)")
    export.add_argument("--force", action="store_true", help="replace an existing --out")
    export.add_argument("--version", default="1.0", help="the dataset version in registry.json (default 1.0)")
    export.add_argument("--splits", help="comma-separated base splits (default: all)")
    export.add_argument("--limit", type=int, help="only the first N tasks of each split")
    export.add_argument("--repo-id", default=None, help="the Hugging Face dataset the card names")
    export.add_argument(
        "--source-revision", default=None, help="the platoon commit the dataset was made from"
    )
    args = parser.parse_args(argv)

    from platoon_textcraft.harbor.export import DEFAULT_REPO_ID, export_dataset

    splits = [s.strip() for s in args.splits.split(",") if s.strip()] if args.splits else None
    try:
        tasks = export_dataset(
            args.out,
            variant=args.variant,
            version=args.version,
            splits=splits,
            limit=args.limit,
            repo_id=args.repo_id or DEFAULT_REPO_ID,
            source_revision=args.source_revision,
            force=args.force,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (FileExistsError, ValueError) as exc:
        print(f"textcraft export: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(tasks)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
