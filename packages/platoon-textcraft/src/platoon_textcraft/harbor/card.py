"""The dataset card (`README.md`) of an exported TextCraft dataset: front matter, how to run it, the format, the
verifier, split tables, provenance, license and citations. Deterministic: it names only what the export was given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from platoon_textcraft.harbor.variants import ExportedTask, Variant

DIFFICULTY_ORDER = ("easy", "medium", "hard", "extreme")


def _size_category(n: int) -> str:
    for bound, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < bound:
            return label
    return "100K<n<1M"


def _exporter_version() -> str:
    """The installed platoon-textcraft's version, which the provenance names."""
    from importlib import metadata

    try:
        return metadata.version("platoon-textcraft")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def dataset_card(
    v: Variant,
    by_split: Mapping[str, Sequence[ExportedTask]],
    *,
    version: str,
    repo_id: str,
    source_revision: str | None,
    sources: Mapping[str, str],
    recipes_sha256: str,
) -> str:
    total = sum(len(tasks) for tasks in by_split.values())
    first = next((tasks[0] for tasks in by_split.values() if tasks), None)
    example = first.name if first else f"{v.world}/train-00000"
    example_dir = first.path if first else f"tasks/{v.world}-train-00000"
    world = (
        "generated recipes up to 12 levels deep with abstract item names (`m3_i5`, `raw_a1`), one target per task"
        if v.synth
        else "Minecraft 1.16.5 crafting recipes (ADaPT's TextCraft), one to three targets per task"
    )
    lines = [
        "---",
        f"pretty_name: {v.title}",
        "license: mit",
        "tags:",
        "- rl-environment",
        "- harbor",
        "- textcraft",
        "- crafting",
        "- planning",
        "size_categories:",
        f"- {_size_category(total)}",
        "viewer: false",
        "---",
        "",
        f"# {v.title} (Harbor tasks)",
        "",
        f"{v.title} as {total:,} [Harbor](https://github.com/laude-institute/harbor) tasks: craft target items from "
        f"an inventory by recipe, on {world}. Version {version}, exported by platoon-textcraft's "
        f"`python -m platoon_textcraft.harbor export` from the `{v.environment}` environment's shipped tasks.",
        "",
        "## Run it",
        "",
        "With Harbor (0.21.0 or later), for example the oracle on one task:",
        "",
        "```bash",
        f"harbor run -p {example_dir} -a oracle",
        "```",
        "",
        "With platoon (`platoon-harbor` installed), as a Harbor environment; `platoon prepare` fetches the tasks and",
        "builds their images once per site:",
        "",
        "```yaml",
        "environments:",
        "  - service: harbor",
        "    service_kwargs:",
        f"      dataset: hf://datasets/{repo_id}@<commit>",
        "      select: {split: train" + (", difficulty: medium}" if v.synth else "}"),
        "    harness: platoon-bash",
        "```",
        "",
        "A local copy works too: `service_kwargs: {dataset_dir: <this directory>, splits: splits.json}`. Check the",
        "dataset before training with `harness: platoon-oracle` (every task scores 1) and `platoon-noop` (every",
        "task scores 0).",
        "",
        "## The game",
        "",
        "The agent plays with the `textcraft` command (`/usr/local/bin/textcraft`, a standard-library Python file in",
        "`/app/textcraft`):",
        "",
        "| Command | Prints |",
        "|---|---|",
        "| `textcraft craft TARGET COUNT ING=N ...` (or `craft --json '{...}'`) | `Successfully crafted <n> <item>(s)` or an `Error: ...` text |",
        "| `textcraft info ITEM ...` (alias `get_info`) | a JSON list: can_craft, is_base, in_inventory, crafting_depth, recipes |",
        "| `textcraft inventory` (alias `view_inventory`) | the inventory as JSON |",
        "| `textcraft finish MESSAGE...` | the message; no command is accepted after it |",
        "",
        "COUNT is the total produced (a multiple of the recipe's yield) and every ingredient amount must be exact.",
        "Exit codes: 0 done, 1 game error, 2 usage error, 3 cannot play. The texts are those of platoon-textcraft's",
        f"`{v.environment}` environment, character for character.",
        "",
        "## Format",
        "",
        "- `registry.json`: one Harbor dataset per split; `splits.json`: split (and split-difficulty) to task names;",
        "  `task-index.json`: task name to its metadata, path and Harbor content digest.",
        f"- `{example_dir}/`: `task.toml`, `instruction.md`, `environment/` (Dockerfile, `textcraft_game.py`,",
        "  `recipes.json`, `task.json`), `tests/` (`test.sh`, a Dockerfile and the verifier's own copies of the",
        "  game, recipes and task), `solution/solve.sh` (the gold trajectory as `textcraft` commands).",
        "- Files shared by every task (the game, the recipes) are hard links of one copy.",
        "",
        "## Verifier",
        "",
        "The state is the action log `/app/textcraft/actions.jsonl`, the task's one artifact. `tests/test.sh` runs",
        "`textcraft_game.py verify` in a separate verifier image with its own copies of the game, recipes and task:",
        "it opens the log without following symlinks and replays it strictly, so a record the command could not have",
        "written (a craft the rules refuse claimed as done, a skipped sequence number, an edited line) fails the",
        "episode. The reward (`reward.json`) is 1 when the episode ended with `textcraft finish` and every target's",
        "gain over the starting inventory reaches its count, else 0; `textcraft-verdict.json` says why.",
        "",
        "## Splits",
        "",
    ]
    if v.synth:
        lines += ["| Split | Tasks | easy | medium | hard | extreme |", "|---|---:|---:|---:|---:|---:|"]
        for split, tasks in by_split.items():
            counts = [sum(t.difficulty == d for t in tasks) for d in DIFFICULTY_ORDER]
            lines.append(f"| {split} | {len(tasks):,} | " + " | ".join(f"{n:,}" for n in counts) + " |")
        lines += [
            "",
            "Difficulty by the target's crafting depth: easy 2-3, medium 4-6, hard 7-9, extreme 10-12. Train and val",
            "targets are disjoint. Task names count within the base split (`"
            + example
            + "`); `[metadata] env_split_task_id` gives the index within the difficulty split.",
        ]
    else:
        lines += ["| Split | Tasks |", "|---|---:|"]
        lines += [f"| {split} | {len(tasks):,} |" for split, tasks in by_split.items()]
    lines += [
        "",
        "## Provenance",
        "",
        f"Exported by platoon-textcraft {_exporter_version()} from commit `{source_revision or 'unknown'}` of platoon. Source task files",
        "(SHA-256):",
        "",
        *(f"- `{name}`: `{digest}`" for name, digest in sources.items()),
        f"- `recipes.json` (this export's world): `{recipes_sha256}`",
        "",
        "## License",
        "",
        "MIT (see `LICENSE`).",
        "",
        "## Citations",
        "",
        "```bibtex",
        "@inproceedings{prasad2024adapt,",
        "  title     = {ADaPT: As-Needed Decomposition and Planning with Language Models},",
        "  author    = {Prasad, Archiki and Koller, Alexander and Hartmann, Mareike and Clark, Peter and",
        "               Sabharwal, Ashish and Bansal, Mohit and Khot, Tushar},",
        "  booktitle = {Findings of the Association for Computational Linguistics: NAACL 2024},",
        "  year      = {2024}",
        "}",
        "```",
    ]
    if v.synth:
        lines += [
            "",
            "TextCraft-Synth was made for the RAO experiments (Gandhi, Chakraborty, Wang, Kumar, Neubig,",
            "arXiv:2605.06639, 2026).",
        ]
    return "\n".join(lines) + "\n"
