"""Check platoon against skyrl-tx, SkyRL's independent Tinker-compatible server, on the CPU.

    python scripts/interop_skyrl.py            # any Python 3.11+; it picks every environment itself

It installs skyrl-tx 0.3.0 (with CPU JAX) into an environment of its own under `.cache/skyrl-tx/venv` (about
6 GB, outside the workspace's lock), builds a tiny Qwen3 checkpoint there (no hub), starts skyrl-tx's API server
and engine on it, asks each platoon environment's Tinker SDK whether it can talk to the server, then, from the
platoon environment that can: checks that `platoon train` with the example's loss (cispo, which skyrl-tx lacks) is
refused at start (exit 78), runs `platoon train` on the bandit (a few steps, `loss_fn: importance_sampling`) and
`platoon eval` of its final checkpoint, and checks that the run trained and recorded its checkpoints.
It ends with a short report; exit 0 when every check passed, 1 otherwise. docs/local-server.md says more.

What it works around, without touching skyrl-tx's files:
- skyrl-tx's API server starts its engine as `uv run --extra tinker --extra jax -m tx.tinker.engine ...`, which
  works only inside SkyRL's checkout. The server gets a `uv` of this script's own first on its PATH that runs the
  named module with the skyrl-tx environment's Python (`tx.tinker.engine` is the package's engine entry point).
- skyrl-tx reads `rope_theta` at the top of config.json, which transformers 5 no longer writes: the checkpoint's
  config is written here in full, by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKDIR = ROOT / ".cache" / "skyrl-tx"
TOY_TOKENIZER = ROOT / "packages" / "platoon-core" / "src" / "platoon" / "renderers" / "toy_tokenizer"
TRAIN_EXAMPLE = ROOT / "examples" / "bandit" / "train.yaml"
EVAL_EXAMPLE = ROOT / "examples" / "bandit" / "eval.yaml"

#: skyrl-tx's `jax` extra pulls jax[cuda12]; on the CPU plain jax with flax and optax is what the engine needs.
SKYRL_REQUIREMENTS = ("skyrl-tx[tinker]==0.3.0", "jax>=0.8,<1", "flax>=0.12.2", "optax>=0.2.5")
#: the platoon environments this repository's lock builds: the newest SDK (the default) and the oldest
PLATOON_ENVS = (ROOT / ".venv", ROOT / ".venv-tinker-oldest")
#: skyrl-tx does not check keys; the SDK wants one shaped like Tinker's
API_KEY = "tml-skyrl-interop-check"
#: the only losses skyrl-tx 0.3.0 implements (tx/tinker/loss_fns.py)
SKYRL_LOSS = "importance_sampling"

# Every wait is bounded (seconds): sampling on the CPU is slow, but never unbounded.
INSTALL_TIMEOUT = 1800
SERVER_START_TIMEOUT = 120
PROBE_TIMEOUT = 120
TRAIN_TIMEOUT = 1800
EVAL_TIMEOUT = 900
REFUSAL_TIMEOUT = 300
STOP_GRACE = 15

# The tiny model's shape (Qwen3: grouped-query attention with q/k norms, SwiGLU MLP, tied embeddings).
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 4, 2, 16
# Token ids in platoon's toy tokenizer (byte-level: a byte's id is its value).
NEWLINE, IM_END, PAD = 10, 258, 256
LETTERS = {"A": 65, "B": 66, "C": 67, "D": 68}

# skyrl-tx's API server runs `uv run [options] -m MODULE ARGS`; this stands in for that uv (see the docstring).
UV_SHIM = """#!/bin/sh
# Written by platoon's scripts/interop_skyrl.py: skyrl-tx's API server starts its engine with
# `uv run --extra ... -m MODULE ARGS`, which needs SkyRL's checkout; run MODULE with this environment instead.
while [ $# -gt 0 ] && [ "$1" != "-m" ]; do shift; done
if [ $# -lt 2 ]; then echo "interop uv shim: expected '-m MODULE'" >&2; exit 2; fi
module=$2
shift 2
exec "{python}" -m "$module" "$@"
"""


class CheckFailed(Exception):
    """A check of the run did not hold; the message is one line."""


@dataclass
class Report:
    """What ran and what was found, printed at the end."""

    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.lines.append(line)
        print(f"  {line}", flush=True)

    def check(self, ok: bool, line: str) -> None:
        self.note(("PASS " if ok else "FAIL ") + line)
        if not ok:
            self.failures.append(line)


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


# -- the skyrl-tx environment -----------------------------------------------------------------------------------


def skyrl_python(workdir: Path) -> Path:
    return workdir / "venv" / "bin" / "python"


def ensure_skyrl_env(workdir: Path, base_python: str) -> str:
    """Create (once) the skyrl-tx environment with uv, never downloading a Python; returns skyrl-tx's version."""
    venv = workdir / "venv"
    marker = venv / "platoon-interop-requirements.txt"
    wanted = "\n".join(SKYRL_REQUIREMENTS) + "\n"
    uv = shutil.which("uv")
    if uv is None:
        raise CheckFailed(
            "uv is not on PATH: install uv (https://docs.astral.sh/uv/) to build skyrl-tx's environment"
        )
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    if not (marker.exists() and marker.read_text() == wanted and skyrl_python(workdir).exists()):
        print(f"installing {', '.join(SKYRL_REQUIREMENTS)} into {venv} (about 6 GB) ...", flush=True)
        run_checked([uv, "venv", "--quiet", "--python", base_python, str(venv)], env=env, timeout=120)
        run_checked(
            [uv, "pip", "install", "--quiet", "--python", str(skyrl_python(workdir)), *SKYRL_REQUIREMENTS],
            env=env,
            timeout=INSTALL_TIMEOUT,
        )
        marker.write_text(wanted)
    return package_version(skyrl_python(workdir), "skyrl-tx")


def package_version(python: Path, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return result.stdout.strip() if result.returncode == 0 else ""


def run_checked(command: Sequence[str], *, env: dict[str, str], timeout: float) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise CheckFailed(f"{command[0]} {command[1]} failed (exit {result.returncode}): {' | '.join(tail)}")


# -- the tiny checkpoint --------------------------------------------------------------------------------------------


def build_checkpoint(out: Path) -> None:
    """Write a tiny Qwen3 checkpoint with platoon's toy tokenizer into `out` (run in skyrl-tx's environment).

    The weights are random (seeded) except for a few rows that give the untrained model something to learn: the
    decoder layers' output projections start at zero, so the next token depends on the last token's embedding
    alone, and the embeddings of the newline (the end of the assistant header), the four letters and
    `<|im_end|>` make the model answer a bandit task with one letter, each about 1 time in 4, then stop. Groups then
    score differently (`C` is right) and a step has an update, which a fully random model (`C` about 1 time in
    70,000) would not give in a few steps.
    """
    import numpy as np
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOY_TOKENIZER / name, out / name)
    tokenizer = json.loads((TOY_TOKENIZER / "tokenizer.json").read_text())
    ids = [*tokenizer["model"]["vocab"].values(), *(token["id"] for token in tokenizer["added_tokens"])]
    vocab = max(ids) + 1
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        # skyrl-tx reads rope_theta here; transformers 5 moved it into rope_parameters and no longer writes it
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": LAYERS,
        "bos_token_id": None,
        "eos_token_id": IM_END,
        "pad_token_id": PAD,
        "torch_dtype": "float32",
        "dtype": "float32",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    rng = np.random.default_rng(0)

    def noise(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(size: int) -> np.ndarray:
        return np.ones(size, np.float32)

    # Three embedding dimensions carry the design, the final norm's weight -1 on the second one making the
    # bilinear form (logit of j after i ~ e_j . w . e_i / rms(e_i)) indefinite, which tied embeddings need to
    # favour `<|im_end|>` after a letter but not a letter after a letter:
    # after the newline the letters score 8 x 1.5 = 12 (the rest about 0); after a letter `<|im_end|>` scores
    # about 21 and the letters about -16.
    embed = noise(vocab, HIDDEN)
    embed[NEWLINE] = 0.0
    embed[NEWLINE, 2] = 0.25
    for token in LETTERS.values():
        embed[token] = 0.0
        embed[token, 1] = 3.0
        embed[token, 2] = 1.5
    embed[IM_END] = 0.0
    embed[IM_END, 1] = -3.0
    final_norm = ones(HIDDEN)
    final_norm[1] = -1.0
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": final_norm}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        tensors |= {
            prefix + "input_layernorm.weight": ones(HIDDEN),
            prefix + "post_attention_layernorm.weight": ones(HIDDEN),
            prefix + "self_attn.q_proj.weight": noise(HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": noise(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": noise(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": np.zeros((HIDDEN, HEADS * HEAD_DIM), np.float32),
            prefix + "self_attn.q_norm.weight": ones(HEAD_DIM),
            prefix + "self_attn.k_norm.weight": ones(HEAD_DIM),
            prefix + "mlp.gate_proj.weight": noise(INTERMEDIATE, HIDDEN),
            prefix + "mlp.up_proj.weight": noise(INTERMEDIATE, HIDDEN),
            prefix + "mlp.down_proj.weight": np.zeros((HIDDEN, INTERMEDIATE), np.float32),
        }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    # What the untrained model answers, computed from the same arrays (the layers add nothing yet).
    def next_token(last: int) -> np.ndarray:
        hidden = embed[last] / np.sqrt(np.mean(embed[last] ** 2) + 1e-6) * final_norm
        logits = embed @ hidden
        probabilities = np.exp(logits - logits.max())
        return probabilities / probabilities.sum()

    first = next_token(NEWLINE)
    summary = {
        "p_first": {letter: round(float(first[token]), 3) for letter, token in LETTERS.items()},
        "p_stop_after_letter": round(float(next_token(LETTERS["C"])[IM_END]), 4),
    }
    (out / "interop-model.json").write_text(json.dumps(summary) + "\n")


# -- the server ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def skyrl_server(workdir: Path, model_dir: Path, port: int) -> Iterator[str]:
    """skyrl-tx's API server (and the engine it starts) on 127.0.0.1:`port`; yields its base URL, stops both."""
    state = workdir / "server"
    shutil.rmtree(state, ignore_errors=True)
    (state / "bin").mkdir(parents=True)
    shim = state / "bin" / "uv"
    shim.write_text(UV_SHIM.format(python=skyrl_python(workdir)))
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{state / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "JAX_PLATFORMS": "cpu",
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",  # skyrl-tx logs through rich, which wraps at 80 columns without a terminal
    }
    env.pop("VIRTUAL_ENV", None)
    command = [
        str(skyrl_python(workdir)),
        "-m",
        "tx.tinker.api",
        "--base-model",
        str(model_dir),
        "--backend",
        "jax",
        "--backend-config",
        json.dumps({"max_lora_adapters": 4, "max_lora_rank": 8}),
        "--checkpoints-base",
        str(state / "checkpoints"),
        "--database-url",
        f"sqlite:///{state / 'tinker.db'}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    url = f"http://127.0.0.1:{port}"
    log_path = state / "server.log"
    with log_path.open("w") as log:
        # A session of its own: the engine the API server starts shares its process group, so one signal stops both.
        server = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not healthy(url):
            if server.poll() is not None:
                raise CheckFailed(f"skyrl-tx exited ({server.returncode}) before it answered; see {log_path}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"skyrl-tx did not answer within {SERVER_START_TIMEOUT} s; see {log_path}")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(server)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's group, SIGKILL after STOP_GRACE seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=STOP_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


# -- platoon's side ---------------------------------------------------------------------------------------------------

# Run in a platoon environment: can its SDK open a session with the server? Prints one JSON line.
HANDSHAKE = """
import json, sys
import tinker
try:
    client = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
    models = [m.model_name for m in client.get_server_capabilities().supported_models]
    print(json.dumps({"ok": True, "detail": f"serves {len(models)} model(s)"}))
except Exception as error:
    detail = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    response = getattr(error, "response", None)
    if response is not None:
        detail += f" (from {response.request.method} {response.request.url.path})"
    print(json.dumps({"ok": False, "detail": detail}))
"""


@dataclass
class PlatoonEnv:
    path: Path
    sdk: str
    handshake_ok: bool = False
    detail: str = ""

    @property
    def platoon(self) -> Path:
        return self.path / "bin" / "platoon"

    @property
    def name(self) -> str:
        return self.path.name


def platoon_env() -> dict[str, str]:
    env = {**os.environ, "TINKER_API_KEY": API_KEY, "HF_HUB_OFFLINE": "1", "TINKER_TELEMETRY": "0"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("TINKER_BASE_URL", None)
    return env


def handshake(env_dir: Path, url: str) -> PlatoonEnv:
    python = env_dir / "bin" / "python"
    found = PlatoonEnv(env_dir, package_version(python, "tinker"))
    try:
        result = subprocess.run(
            [str(python), "-c", HANDSHAKE, url, API_KEY],
            env=platoon_env(),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
        )
        answer = json.loads(result.stdout.strip().splitlines()[-1])
        found.handshake_ok, found.detail = bool(answer["ok"]), str(answer["detail"])
    except subprocess.TimeoutExpired:
        found.detail = f"no answer within {PROBE_TIMEOUT} s"
    except (json.JSONDecodeError, IndexError, KeyError):
        found.detail = "the probe printed no answer"
    return found


@dataclass
class Finished:
    returncode: int
    output: str
    seconds: float


def run_platoon(env: PlatoonEnv, args: Sequence[str], *, cwd: Path, timeout: float, log: Path) -> Finished:
    """`platoon ARGS` from `env`, output to `log`; on `timeout` it gets SIGINT (platoon stops at its own pace),
    then SIGKILL."""
    command = [str(env.platoon), *args]
    print("$ " + " ".join(command), flush=True)
    started = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, env=platoon_env(), cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop_group(process)
    return Finished(process.returncode, log.read_text(errors="replace"), time.monotonic() - started)


def read_jsonl(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_overrides(
    url: str, model_dir: Path, runs: Path, steps: int, loss: str | None = SKYRL_LOSS
) -> list[str]:
    """The bandit example's config pointed at skyrl-tx and made small; `loss` None keeps the example's (cispo)."""
    return [
        f"tinker_base_url={url}",
        f"log_path={runs}",
        f"train.model_name={model_dir}",
        *([f"train.loss_fn={loss}"] if loss else []),
        f"train.max_training_steps={steps}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "train.sample_timeout_seconds=300",
        "checkpoint.every=0",
    ]


def sample_requests(server_log: Path) -> int:
    """Sampling requests skyrl-tx has taken so far (its access log)."""
    return server_log.read_text(errors="replace").count("/api/v1/asample")


def check_refusal(
    report: Report, finished: Finished, runs: Path, samples_before: int, samples_after: int
) -> None:
    """A loss skyrl-tx lacks is refused at start: exit 78, one line naming the loss (after the progress lines, no
    traceback), no rollout, nothing sampled."""
    lines = [line for line in finished.output.splitlines() if line.strip()]
    refusal = lines[-1] if lines else ""
    one_line = (
        "Traceback" not in finished.output
        and refusal.startswith("platoon: train.loss_fn")
        and "cispo" in refusal
    )
    run_dir = runs / "bandit" / "run"
    rolled_out = (run_dir / "rollouts").exists() or (run_dir / "metrics.jsonl").exists()
    report.check(
        finished.returncode == 78 and one_line and not rolled_out and samples_after == samples_before,
        f"platoon train with the default loss (cispo) exited {finished.returncode} in {finished.seconds:.0f} s, "
        f"{'one line naming train.loss_fn' if one_line else 'not in one line'}, "
        f"{samples_after - samples_before} sampling request(s), {'rollouts written' if rolled_out else 'no rollout'}",
    )
    report.note(f"it said: {refusal[:400]}")


def check_training(report: Report, finished: Finished, run_dir: Path, steps: int) -> dict[str, object] | None:
    """The run's own records: it finished every step, took optimizer steps, and recorded its final checkpoint.
    Returns that checkpoint's record."""
    report.check(
        finished.returncode == 0, f"platoon train exited {finished.returncode} in {finished.seconds:.0f} s"
    )
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    logged = [row["step"] for row in metrics]
    report.check(logged == list(range(1, steps + 1)), f"metrics.jsonl logged steps {logged}")
    for row in metrics:
        report.note(
            f"step {row['step']}: mean reward {row.get('train/batch/task_reward/avg', float('nan')):.3f}, "
            f"optimizer updates {row.get('train/batch/optimizer_updates', 0)}"
        )
    updates = int(metrics[-1].get("train/optim/updates_total", 0)) if metrics else 0
    report.check(updates > 0, f"the run took {updates} optimizer step(s) (train/optim/updates_total)")
    checkpoints = read_jsonl(run_dir / "checkpoints.jsonl")
    report.note(f"checkpoints.jsonl: {[(row['name'], row['kind']) for row in checkpoints]}")
    final = next((row for row in checkpoints if row.get("kind") == "final"), None)
    if final is None:
        report.check(False, "checkpoints.jsonl records a final checkpoint")
        return None
    recorded = str(final.get("state_path", "")).startswith("tinker://") and str(
        final.get("sampler_path", "")
    ).startswith("tinker://")
    report.check(
        recorded and final.get("optimizer_steps") == updates,
        f"final checkpoint after {final.get('optimizer_steps')} optimizer step(s): "
        f"{final.get('state_path')}, sampler {final.get('sampler_path')}",
    )
    return final


def check_server_checkpoints(report: Report, url: str, final: dict[str, object]) -> None:
    """skyrl-tx lists the final checkpoint (weights and sampler weights) under the run's model."""
    model_id = str(final["state_path"]).removeprefix("tinker://").split("/")[0]
    request = urllib.request.Request(
        f"{url}/api/v1/training_runs/{model_id}/checkpoints", headers={"X-API-Key": API_KEY}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        listed = [str(row.get("tinker_path")) for row in json.load(answer).get("checkpoints", [])]
    wanted = {str(final["state_path"]), sampler_weights_path(str(final["sampler_path"]))}
    report.check(
        wanted <= set(listed),
        f"skyrl-tx lists {len(listed)} checkpoint(s) of {model_id}, the final ones among them",
    )


def sampler_weights_path(path: str) -> str:
    """`tinker://<model>/sampler_weights/<name>`: how skyrl-tx's checkpoint listing spells a sampler checkpoint, whose
    save_weights_for_sampler answers `tinker://<model>/<name>` (which platoon records as it is)."""
    parts = path.removeprefix("tinker://").split("/")
    if len(parts) == 2:
        return f"tinker://{parts[0]}/sampler_weights/{parts[1]}"
    return path


def check_evaluation(report: Report, final_report: Path, sampler_path: str) -> None:
    """The evaluation sampled the trained checkpoint and scored every rollout (4 tasks x 2)."""
    if not final_report.exists():
        report.check(False, f"platoon eval wrote {final_report}")
        return
    written = json.loads(final_report.read_text())
    summary = written["summary"]
    report.check(
        written["model"].get("model_path") == sampler_path
        and summary["total_rollouts"] == 8
        and summary["outcome_status_counts"] == {"scored": 8},
        f"final_report.json: {summary['outcome_status_counts']} of {summary['total_rollouts']} rollouts of "
        f"{written['model'].get('model_path')}, success rate {summary['success_rate']:.3f}",
    )


# -- main ------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help="skyrl-tx's environment and the run"
    )
    parser.add_argument(
        "--python",
        default=os.environ.get("UV_PYTHON", "3.12"),
        help="the Python skyrl-tx's environment is made from (never downloaded); default $UV_PYTHON, else 3.12",
    )
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument(
        "--platoon-env",
        type=Path,
        action="append",
        help="a platoon environment to run platoon from (repeatable); default: .venv and .venv-tinker-oldest, "
        "platoon running from the newest SDK that opens a session with skyrl-tx",
    )
    parser.add_argument("--build-checkpoint", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_checkpoint is not None:
        build_checkpoint(args.build_checkpoint)
        return 0

    report = Report()
    workdir: Path = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run_checks(args, workdir, report)
    except CheckFailed as failure:
        report.check(False, str(failure))
        return summarize(report)


def run_checks(args: argparse.Namespace, workdir: Path, report: Report) -> int:
    section("skyrl-tx environment")
    version = ensure_skyrl_env(workdir, args.python)
    report.note(
        f"skyrl-tx {version}, jax {package_version(skyrl_python(workdir), 'jax')}, in {workdir / 'venv'}"
    )

    section("tiny Qwen3 checkpoint")
    model_dir = workdir / "model"
    shutil.rmtree(model_dir, ignore_errors=True)
    run_checked(
        [str(skyrl_python(workdir)), str(Path(__file__).resolve()), "--build-checkpoint", str(model_dir)],
        env=dict(os.environ),
        timeout=120,
    )
    model = json.loads((model_dir / "interop-model.json").read_text())
    report.note(
        f"{model_dir}: untrained first answer {model['p_first']}, then stops {model['p_stop_after_letter']}"
    )

    env_dirs = [path.resolve() for path in (args.platoon_env or PLATOON_ENVS)]
    missing = [str(path) for path in env_dirs if not (path / "bin" / "platoon").exists()]
    if missing:
        report.note(f"skipped (no platoon there): {', '.join(missing)}")
    env_dirs = [path for path in env_dirs if str(path) not in missing]
    if not env_dirs:
        raise CheckFailed(
            "no platoon environment: run `uv sync` (and the tinker-oldest group's, docs/local-server.md)"
        )

    port = free_port()
    section(f"skyrl-tx on 127.0.0.1:{port} (log: {workdir / 'server' / 'server.log'})")
    with skyrl_server(workdir, model_dir, port) as url:
        report.note(f"{url} answers /api/v1/healthz")

        section("SDK handshake from each platoon environment")
        envs = [handshake(path, url) for path in env_dirs]
        for env in envs:
            report.note(
                f"{env.name}: tinker {env.sdk}: {'works' if env.handshake_ok else 'fails'}: {env.detail}"
            )
        usable = sorted((env for env in envs if env.handshake_ok), key=lambda env: sdk_key(env.sdk))
        if not usable:
            raise CheckFailed("no platoon environment's SDK opens a session with skyrl-tx")
        chosen = usable[-1]
        report.note(f"platoon runs from {chosen.path} (tinker {chosen.sdk})")

        section("platoon train with the example's loss (cispo), which skyrl-tx lacks: refused at start")
        refused_runs = workdir / "runs-refused"
        shutil.rmtree(refused_runs, ignore_errors=True)
        server_log = workdir / "server" / "server.log"
        samples_before = sample_requests(server_log)
        finished = run_platoon(
            chosen,
            [
                "train",
                str(TRAIN_EXAMPLE),
                *train_overrides(url, model_dir, refused_runs, args.steps, loss=None),
            ],
            cwd=workdir,
            timeout=REFUSAL_TIMEOUT,
            log=workdir / "train-refused.log",
        )
        print(finished.output.rstrip(), flush=True)
        check_refusal(report, finished, refused_runs, samples_before, sample_requests(server_log))

        section(f"platoon train: the bandit, {args.steps} steps, loss_fn {SKYRL_LOSS}")
        runs = workdir / "runs"
        shutil.rmtree(runs, ignore_errors=True)
        finished = run_platoon(
            chosen,
            ["train", str(TRAIN_EXAMPLE), *train_overrides(url, model_dir, runs, args.steps)],
            cwd=workdir,
            timeout=TRAIN_TIMEOUT,
            log=workdir / "train.log",
        )
        print(finished.output.rstrip(), flush=True)
        final = check_training(report, finished, runs / "bandit" / "run", args.steps)

        if final is not None:
            check_server_checkpoints(report, url, final)
            # the sampler path as skyrl-tx answered it (and platoon recorded it), short form and all
            sampler_path = str(final["sampler_path"])
            report.note(f"skyrl-tx answered sampler path {sampler_path}; platoon eval gets it as it is")
            section("platoon eval of the last checkpoint")
            eval_dir = workdir / "eval"
            shutil.rmtree(eval_dir, ignore_errors=True)
            finished = run_platoon(
                chosen,
                [
                    "eval",
                    str(EVAL_EXAMPLE),
                    f"tinker_base_url={url}",
                    f"inference.model_name={model_dir}",
                    f"inference.model_path={sampler_path}",
                    f"inference.output_dir={eval_dir}",
                    "inference.workflow.num_rollouts_per_task=2",
                    "inference.sample_timeout_seconds=300",
                ],
                cwd=workdir,
                timeout=EVAL_TIMEOUT,
                log=workdir / "eval.log",
            )
            print(finished.output.rstrip(), flush=True)
            report.check(
                finished.returncode == 0,
                f"platoon eval exited {finished.returncode} in {finished.seconds:.0f} s",
            )
            check_evaluation(report, eval_dir / "reports" / "final_report.json", sampler_path)
    return summarize(report)


def sdk_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def summarize(report: Report) -> int:
    section("report")
    for line in report.lines:
        print(f"  {line}")
    verdict = "all checks passed" if not report.failures else f"{len(report.failures)} check(s) failed"
    print(f"\ninterop_skyrl: {verdict}", flush=True)
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
