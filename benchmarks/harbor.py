"""Harbor: the time of a second `platoon prepare` on a prepared site (target: under 2 s for the example dataset, no
image rebuilt), and graded episodes per second with `platoon-oracle` in Docker at concurrency 4.

    . /tmp/platoon-docker-engine.env   # an engine with platoon-test/* images (.ci/docker-engine start)
    uv run --frozen python benchmarks/harbor.py [--repeats 5] [--episodes 16] [--concurrency 4]

Two configurations, each prepared once, then prepared again `--repeats` times:

- `example`: examples/harbor-dataset/train.yaml as it is (a `dataset_dir` of four tasks on a prebuilt image): the
  steps read the tasks, plan their images (none to build) and find the toy tokenizer.
- `example, fetched, Dockerfiles`: the same four tasks copied, each given an `environment/Dockerfile` (`FROM
  platoon-test/python:bookworm`, `COPY . /app/`) and named as `dataset: <dir>`, so prepare fetches them into the
  site cache (a local directory is re-fetched, that is re-hashed, every time), builds four images into
  `<cache>/harbor/images/docker.json` the first time, and after that only finds them: one `docker images` call.

Each second prepare runs as the user runs it, `python -m platoon prepare CONFIG` in a fresh process (interpreter
start and imports included), timed from spawn to exit; p50 and max are printed with the `in-process` time of
`platoon.startup.prepare.run_prepare` alone. "No image rebuilt" is checked, not assumed: the image map's bytes, its
entries' image ids and the build logs' modification times are the same before and after every second prepare,
and the step line says `current`. The site (cache, profile) is a temporary directory; the images built are removed.

Then graded episodes per second for both: `platoon-oracle` through `platoon.testing.run_episode` on the harbor service
in Docker at concurrency 4 (`--concurrency`), `--episodes` episodes over the four tasks in turn, each scoring 1; the
second row's sessions open on the images the first prepare built (the service asks `platoon_harbor.images`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "harbor-dataset"
TARGET_S = 2.0


def prepare_once(config: Path, env: dict[str, str]) -> tuple[float, str, str, int]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "prepare", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=1800,
        check=False,
    )
    return time.perf_counter() - started, done.stdout, done.stderr, done.returncode


def in_process(config: Path, env: dict[str, str]) -> float:
    """`run_prepare` alone, in this process (imports already warm after the first call)."""
    from platoon.startup.prepare import run_prepare

    saved = dict(os.environ)
    os.environ.update(env)
    cwd = os.getcwd()
    os.chdir(config.parent)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the steps' own progress lines
            run_prepare(str(config), [], out=lambda line: None, err=lambda line: None)  # warm the imports
            started = time.perf_counter()
            run_prepare(str(config), [], out=lambda line: None, err=lambda line: None)
            return time.perf_counter() - started
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def snapshot(cache: Path) -> tuple[str, dict[str, float]]:
    """(the image map's text, build log -> mtime): what any rebuild would change."""
    image_map = cache / "harbor" / "images" / "docker.json"
    text = image_map.read_text() if image_map.exists() else ""
    logs = cache / "harbor" / "images" / "docker" / "logs"
    return text, {p.name: p.stat().st_mtime for p in logs.glob("*.log")} if logs.is_dir() else {}


def dockerfile_copy(target: Path) -> Path:
    tasks = target / "dataset"
    shutil.copytree(EXAMPLE / "tasks", tasks)
    for task in sorted(p for p in tasks.iterdir() if p.is_dir()):
        (task / "environment").mkdir(exist_ok=True)
        (task / "environment" / "Dockerfile").write_text(
            "FROM platoon-test/python:bookworm\nWORKDIR /app\nCOPY . /app/\n"
        )
        (task / "environment" / "README").write_text(f"the build context of {task.name}\n")
        toml = task / "task.toml"
        toml.write_text(
            "\n".join(line for line in toml.read_text().splitlines() if not line.startswith("docker_image"))
            + "\n"
        )
    config = target / "train.yaml"
    text = (EXAMPLE / "train.yaml").read_text().replace("dataset_dir: tasks", f"dataset: {tasks}")
    config.write_text(text)
    return config


def measure(name: str, config: Path, env: dict[str, str], cache: Path, repeats: int) -> bool:
    seconds, out, err, code = prepare_once(config, env)
    if code != 0:
        print(f"{name}: the first prepare failed ({code}):\n{out}{err}")
        return False
    first_lines = [line for line in out.splitlines() if " images: " in line]
    print(f"{name}: first prepare {seconds:.2f} s; {first_lines[0] if first_lines else ''}")
    times: list[float] = []
    unchanged = True
    lines: list[str] = []
    for _ in range(repeats):
        before = snapshot(cache)
        seconds, out, err, code = prepare_once(config, env)
        times.append(seconds)
        after = snapshot(cache)
        lines = [line for line in out.splitlines() if " images: " in line]
        if (
            code != 0
            or before != after
            or any(": current" not in line and ": none" not in line for line in lines)
        ):
            unchanged = False
            print(f"{name}: the second prepare changed something ({code}):\n{out}{err}")
    alone = in_process(config, env)
    p50, worst = statistics.median(times), max(times)
    verdict = "met" if worst < TARGET_S and unchanged else "NOT met"
    print(
        f"{name}: second prepare p50 {p50:.3f} s, max {worst:.3f} s over {repeats} "
        f"(run_prepare in process {alone:.3f} s); images rebuilt: {'none' if unchanged else 'YES'}; "
        f"{lines[0].split(' images: ', 1)[1] if lines else ''}; target < {TARGET_S:.0f} s: {verdict}"
    )
    return unchanged and worst < TARGET_S


def episodes_per_second(
    name: str, kwargs: dict[str, str], env: dict[str, str], episodes: int, workers: int
) -> bool:
    """Graded episodes per second: `platoon-oracle` (it runs each task's solution/solve.sh) through `run_episode`
    on the harbor service in Docker, `workers` episodes at a time (one service and event loop per worker thread),
    over the dataset's tasks in turn. Every episode must score 1."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from platoon.testing import run_episode
    from platoon_harbor.service import HarborService

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        ids = asyncio.run(HarborService(**kwargs).list_tasks("train"))
        order = [ids[n % len(ids)] for n in range(episodes)]

        def worker(number: int) -> list[tuple[float, float | None]]:
            service = HarborService(**kwargs)
            done = []
            for task_id in order[number::workers]:
                started = time.perf_counter()
                episode = run_episode(task_id, service=service, harness="platoon-oracle")
                outcome = episode.outcome or {}
                done.append((time.perf_counter() - started, (outcome.get("rewards") or {}).get("reward")))
            return done

        started = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            results = [r for rows in pool.map(worker, range(workers)) for r in rows]
        wall = time.perf_counter() - started
    finally:
        os.environ.clear()
        os.environ.update(saved)
    scored = sum(1 for _, reward in results if reward == 1.0)
    times = sorted(seconds for seconds, _ in results)
    print(
        f"{name}: {len(results)} episodes (platoon-oracle, docker, concurrency {workers}) in {wall:.1f} s = "
        f"{len(results) / wall:.2f} episodes/s; per episode p50 {statistics.median(times):.2f} s, "
        f"max {times[-1]:.2f} s; scored 1: {scored}/{len(results)}"
    )
    return scored == len(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=16, help="graded episodes per row")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    if subprocess.run(
        ["docker", "image", "inspect", "platoon-test/python:bookworm"], capture_output=True
    ).returncode:
        print(
            "no Docker engine with platoon-test/python:bookworm: run .ci/docker-engine start and source its env"
        )
        return 1
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="platoon-bench-harbor-") as folder:
        work = Path(folder)
        cache = work / "cache"
        (work / "xdg" / "platoon").mkdir(parents=True)
        (work / "xdg" / "platoon" / "site.yaml").write_text(f"cache: {cache}\n")
        env = dict(os.environ, XDG_CONFIG_HOME=str(work / "xdg"), HF_HUB_OFFLINE="1")
        env.pop("PLATOON_SITE", None)
        env.pop("PLATOON_HARBOR_CACHE", None)
        example = work / "example"
        shutil.copytree(EXAMPLE, example)
        ok &= measure("example", example / "train.yaml", env, cache, args.repeats)
        copied = work / "fetched"
        copied.mkdir()
        try:
            ok &= measure("example, fetched, Dockerfiles", dockerfile_copy(copied), env, cache, args.repeats)
            for name, kwargs in (
                ("example", {"dataset_dir": str(example / "tasks")}),
                ("example, fetched, Dockerfiles", {"dataset": str(copied / "dataset")}),
            ):
                ok &= episodes_per_second(name, kwargs, env, args.episodes, args.concurrency)
        finally:
            image_map = cache / "harbor" / "images" / "docker.json"
            if image_map.exists():
                tags = [e["image"] for e in json.loads(image_map.read_text())["images"].values()]
                subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True, check=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
