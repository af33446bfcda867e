"""`platoon train` end to end: the bandit example learns on the embedded local server; key refusals come first.

The bandit's answer is one token of a 265-token vocabulary, so a random toy model starts near 0 reward; group
baselines must lift it to near 1 within the run.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from platoon.cli import main
from platoon.harness.agent import AgentResult
from platoon.harness.function import harness

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "bandit" / "train.yaml"
EVAL = REPO / "examples" / "bandit" / "eval.yaml"

#: the one line a start without a Tinker key says (naming the local server, which needs none)
MISSING_KEY = (
    "TINKER_API_KEY is not set: the policy is sampled through Tinker, which needs it; for the embedded local "
    "server, which needs none, set TINKER_BASE_URL=local (or tinker_base_url: local in the config)"
)


def _run_dir(log_path: Path) -> Path:
    return log_path / "bandit" / "run"


@pytest.mark.slow
def test_the_bandit_example_learns_on_the_local_server(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    # The local server keeps its checkpoints under the site cache: a profile points it into the test's directory.
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    started = time.monotonic()
    status = main(["train", str(EXAMPLE), f"log_path={tmp_path}"])  # the example as the README runs it
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == 0, err
    run = _run_dir(tmp_path)
    assert (tmp_path / "cache" / "local-tinker").is_dir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = [row["train/batch/task_reward/avg"] for row in rows]
    print(f"{seconds:.1f} s; reward per step: {' '.join(f'{r:.2f}' for r in curve)}")
    assert [row["step"] for row in rows] == list(range(1, 25))
    assert curve[0] < 0.1, f"a random model rarely answers C: {curve}"
    # Near 1 by the end: sampling is not seeded, so one of the last steps may still draw a wrong answer or two.
    # Learning waits for the first lucky "C" (about 1 rollout in 320) and then takes 4-5 steps; a run with none in
    # its first 17 steps of 128 rollouts (probability about 0.1%) fails here: a chance failure, not a hidden one.
    assert statistics.fmean(curve[-3:]) >= 0.8, f"the reward did not reach near 1: {curve}"
    assert rows[-1]["train/optim/updates_total"] >= 1
    for name in ("config.resolved.yaml", "lock.json", "checkpoints.jsonl"):
        assert (run / name).is_file(), name
    assert not (run / "process.json").exists()  # released at the end
    checkpoints = [json.loads(line) for line in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[0]["name"] == "recovery-000000" and checkpoints[-1]["name"] == "final"
    assert all(c["sampler_path"].startswith("tinker://") for c in checkpoints)
    # Not a terminal (captured), so plain lines: one per step, saying why a step took no update, with the elapsed
    # time and (but on the last) the ETA.
    steps = [line for line in err.splitlines() if line.startswith("platoon: step ")]
    assert [line.split(":")[1] for line in steps] == [f" step {n}/24" for n in range(1, 25)]
    for row, line in zip(rows, steps, strict=True):
        assert ("(no update: " in line) == bool(row["train/batch/skipped_optimizer"]), line
        if row["train/batch/task_reward/avg"] in (0.0, 1.0):  # every rollout of every group scored the same
            assert "(no update: all 8 groups scored alike)" in line, line
    assert any("scored alike" in line for line in steps), "the learnt policy's steps score 1 in every group"
    assert re.search(r"; \d+\.\d s \(elapsed \d+:\d\d, ETA \d+:\d\d\)$", steps[0]), steps[0]
    assert re.search(r"; \d+\.\d s \(elapsed \d+:\d\d\)$", steps[-1]), steps[-1]
    # The closing line: the steps, the whole time, how many updated, the last and best rewards, the checkpoints.
    best = max(range(24), key=lambda i: (curve[i], -i))
    summary = re.escape(
        f" ({int(rows[-1]['train/optim/updates_total'])} with an update); reward {curve[-1]:.3f} at step 24 "
        f"(best {curve[best]:.3f} at step {best + 1}); checkpoints in {run / 'checkpoints.jsonl'}"
    )
    assert re.fullmatch(rf"platoon: done: steps 1\.\.24 in \d+:\d\d{summary}", err.splitlines()[-1]), err

    # The policy it saved, evaluated by the example's eval config: the local server of a later command finds the
    # checkpoint under the site cache, and the trained policy answers C on the held-out orders.
    monkeypatch.setenv("TINKER_BASE_URL", "local")
    capsys.readouterr()
    final = checkpoints[-1]["sampler_path"]
    assert (
        main(
            ["eval", str(EVAL), f"inference.model_path={final}", f"inference.output_dir={tmp_path / 'eval'}"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    print(
        f"evaluation of {final}: {summary['successful_rollouts']} of {summary['total_rollouts']} successful"
    )
    assert summary["total_rollouts"] == 4 * 8 and summary["errored_rollouts"] == 0
    assert summary["success_rate"] >= 0.9


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, MISSING_KEY),
        ("sk-wrong", "TINKER_API_KEY must start with tml-, as the Tinker client requires"),
    ],
)
def test_a_missing_or_malformed_key_is_one_line_and_78_before_anything_is_written(
    tmp_path, monkeypatch, capsys, key, message
):
    if key is None:
        monkeypatch.delenv("TINKER_API_KEY", raising=False)
    else:
        monkeypatch.setenv("TINKER_API_KEY", key)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    argv = ["train", str(EXAMPLE), f"log_path={tmp_path}", "tinker_base_url=http://127.0.0.1:9"]
    assert main(argv) == 78
    lines = [line for line in capsys.readouterr().err.splitlines() if "site profile" not in line]
    assert lines == [f"platoon: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_a_config_without_a_length_of_training_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert main(["train", str(EXAMPLE), f"log_path={tmp_path}", "train.max_training_steps=null"]) == 78
    assert "set num_epochs or max_training_steps" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_sample_timeout_variable_is_one_line_and_78_before_anything_is_written(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setenv("TINKER_SAMPLE_TIMEOUT_SECONDS", "soon")
    assert main(["train", str(EXAMPLE), f"log_path={tmp_path}"]) == 78
    # the start still lists the tasks, to report every problem at once; on a slow machine its heartbeat says so
    heartbeat = re.compile(r"^platoon: listing tasks \(\d+ s\)\.\.\.$")
    lines = [line for line in capsys.readouterr().err.splitlines() if not heartbeat.match(line)]
    assert lines == ["platoon: TINKER_SAMPLE_TIMEOUT_SECONDS must be a number of seconds; got 'soon'"]
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_in_use_is_refused(tmp_path, monkeypatch, capsys):
    import socket
    import subprocess

    run = _run_dir(tmp_path)
    run.mkdir(parents=True)
    holder = subprocess.Popen(["sleep", "60"])
    try:
        record = {"command": ["platoon", "train"], "host": socket.gethostname(), "pid": holder.pid}
        (run / "process.json").write_text(json.dumps(record))
        assert main(["train", str(EXAMPLE), f"log_path={tmp_path}"]) == 78
    finally:
        holder.kill()
        holder.wait()
    assert "is in use" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["process.json"]


# ---------------------------------------------------------------------------------------------------------------
# Resume, identity refusal, datum merging


def _small(tmp_path: Path, *overrides: str) -> list[str]:
    """The bandit example cut down to seconds a step: 2 tasks of 4 rollouts, a permanent checkpoint each step."""
    return [
        "train",
        str(EXAMPLE),
        f"log_path={tmp_path}",
        "train.batch_size=2",
        "train.workflow_config.group_size=4",
        "checkpoint.every=1",
        *overrides,
    ]


@pytest.fixture
def site(tmp_path, monkeypatch):
    # The local server keeps its checkpoints under the site cache, which must outlive one start for a resume.
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    profile = tmp_path / "site.yaml"
    profile.write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path / "logs"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_a_stopped_run_resumes_at_the_next_step_and_keeps_every_checkpoint(site, capsys):
    assert main(_small(site, "train.max_training_steps=2")) == 0, capsys.readouterr().err
    run = _run_dir(site)
    first = _rows(run / "checkpoints.jsonl")
    identity = json.loads((run / "identity.json").read_text())
    assert (identity["model"], identity["renderer"]) == ("platoon/toy", "qwen3_instruct")
    assert first[-1]["name"] == "final" and first[-1]["batch"] == 2
    assert first[-1]["task_order"]["next_batch"] == 2  # the order's position rides on the row
    lock = json.loads((run / "lock.json").read_text())
    assert lock["tool_call_parsing"] == {
        "model_name": "platoon/toy",
        "renderer_name": "qwen3_instruct",
        "setting": "renderer",
        "parser": "qwen3_instruct",
    }
    capsys.readouterr()

    assert main(_small(site, "train.max_training_steps=4")) == 0
    err = capsys.readouterr().err
    assert "resuming at step 3 from final" in err
    assert "step 3/4" in err and "step 1/4" not in err
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1, 2, 3, 4]
    rows = _rows(run / "checkpoints.jsonl")
    assert rows[: len(first)] == first  # nothing of the first start was rewritten or pruned
    launch, *rest = rows[len(first) :]
    assert (launch["name"], launch["batch"]) == ("recovery-000002", 2)
    # The resumed start carries on the counters of its resume point.
    assert launch["policy_version"] == first[-1]["policy_version"]
    assert launch["optimizer_steps"] == first[-1]["optimizer_steps"]
    assert (rest[-1]["name"], rest[-1]["batch"], rest[-1]["task_order"]["next_batch"]) == ("final", 4, 4)
    assert not (run / "process.json").exists()

    # Everything done: a third start trains nothing and says so.
    assert main(_small(site, "train.max_training_steps=4")) == 0
    assert "nothing to train" in capsys.readouterr().err
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_evaluation_runs_at_the_configured_steps_and_never_twice_across_a_resume(site, capsys):
    overrides = ("eval.every=2", "eval.at_start=true", "eval.workflow_config.group_size=1")
    assert main(_small(site, "train.max_training_steps=2", *overrides)) == 0, capsys.readouterr().err
    run = _run_dir(site)
    assert [row["step"] for row in _rows(run / "evaluations.jsonl")] == [0, 2]
    # evaluation rows are logged at the step training had reached when they ended, and say which step they measured
    evaluations = [row for row in _rows(run / "metrics.jsonl") if "eval/step" in row]
    assert sorted(row["eval/step"] for row in evaluations) == [0, 2]
    assert all("eval/reward/count" in row and row["step"] >= row["eval/step"] for row in evaluations)
    assert (run / "rollouts" / "eval" / "step_2").is_dir()
    capsys.readouterr()
    # the resumed start evaluates step 4, not step 2 (or 0) again
    assert main(_small(site, "train.max_training_steps=4", *overrides)) == 0
    assert [row["step"] for row in _rows(run / "evaluations.jsonl")] == [0, 2, 4]
    said = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("platoon: evaluation of")
    ]
    assert [line.split(":")[1] for line in said] == [" evaluation of step 4"]
    assert re.fullmatch(
        r"platoon: evaluation of step 4: reward \d\.\d{3} over 4 rollouts; \d+\.\d s", said[0]
    )

    # A start stopped after its final checkpoint, before the final evaluation's row (what a SIGKILL then leaves):
    # the next start evaluates the last step and trains nothing.
    evaluations = (run / "evaluations.jsonl").read_text().splitlines(keepends=True)
    (run / "evaluations.jsonl").write_text("".join(evaluations[:-1]))
    checkpoints = _rows(run / "checkpoints.jsonl")
    assert main(_small(site, "train.max_training_steps=4", *overrides)) == 0
    err = capsys.readouterr().err
    assert (
        "nothing to train" not in err
        and "evaluating it, which the start that trained it did not finish" in err
    )
    assert [row["step"] for row in _rows(run / "evaluations.jsonl")] == [0, 2, 4]
    assert [row["step"] for row in _rows(run / "metrics.jsonl") if "train/step" in row] == [1, 2, 3, 4]
    assert [row["name"] for row in _rows(run / "checkpoints.jsonl")][: len(checkpoints)] == [
        row["name"] for row in checkpoints
    ]
    assert "final" not in [row["name"] for row in _rows(run / "checkpoints.jsonl")][len(checkpoints) :]
    # and then the run is done
    assert main(_small(site, "train.max_training_steps=4", *overrides)) == 0
    assert "nothing to train" in capsys.readouterr().err


@pytest.mark.slow
def test_an_evaluation_that_raises_stops_the_run_at_the_next_step_in_one_line(site, capsys, monkeypatch):
    """Before: the eval loop died with the error and the run's end waited for its evaluation until the watchdog
    ended the process (600 s by default; here it would end the test's worker after 120 s)."""
    from platoon.train.tinker import evaluation

    async def broken_evaluation(*args: Any, **kwargs: Any) -> dict[str, float]:
        raise RuntimeError("the eval service went away")

    monkeypatch.setattr(
        evaluation, "evaluate", broken_evaluation
    )  # an injected fault: no real eval breaks so
    overrides = ("eval.every=1", "eval.workflow_config.group_size=1", "watchdog.timeout_seconds=120")
    assert main(_small(site, "train.max_training_steps=3", *overrides)) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "stopped" in line]
    assert said == [
        "platoon: training stopped at step 2: the evaluation of step 1 failed: RuntimeError: the eval service "
        "went away; what it trained is kept"
    ]
    run = _run_dir(site)
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1, 2]
    assert _rows(run / "checkpoints.jsonl")[-1]["batch"] == 2  # what trained is kept
    assert not (run / "evaluations.jsonl").exists() or not _rows(run / "evaluations.jsonl")


STOPPER = "test-trainer-stopper"
_stop_after: list[int] = []


@harness(STOPPER)
async def _stopper(ctx: Any) -> AgentResult:
    """The bandit's answer; the rollout numbered `_stop_after[0]` asks the trainer to stop, as a first SIGINT does,
    and takes a while to finish."""
    from platoon.train.tinker import supervisor

    _stop_after[1] += 1
    if _stop_after[1] == _stop_after[0]:
        supervisor.request_stop()
        await asyncio.sleep(5)  # the step is still waiting for this group when it notices the request
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}], max_tokens=1)
    await ctx.call_tool("answer", {"letter": reply.text or ""})
    return AgentResult(final_message=reply.text)


@pytest.mark.slow
def test_a_stop_request_abandons_the_batch_it_has_not_applied_and_resume_redoes_it(site, capsys):
    from platoon.train.tinker import supervisor

    harness(STOPPER)(_stopper)  # again: another test may have cleared the registry since this module loaded
    # max_staleness 0: step 2's rollouts start only after step 1 is done, so the stop lands inside step 2
    rollouts_per_step = 2 * 4
    _stop_after[:] = [rollouts_per_step + 1, 0]
    argv = _small(
        site,
        "train.max_training_steps=3",
        "train.max_staleness=0",
        f"environments=[{{env: platoon-bandit, harness: {STOPPER}}}]",
    )
    try:
        assert main(argv) == 130
    finally:
        supervisor._stop.clear()
    run = _run_dir(site)
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1]
    last = _rows(run / "checkpoints.jsonl")[-1]
    assert (last["name"], last["batch"], last["kind"]) == ("000001_interrupted", 1, "interrupted")
    assert "stopped at step 1 as asked" in capsys.readouterr().err
    _stop_after[:] = [0, 0]
    assert main(argv) == 0
    assert [row["step"] for row in _rows(run / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "train.model_name=platoon/other",
            "train.model_name: this run trained platoon/toy and this start names platoon/other",
        ),
        (
            "train.renderer_name=chat_template",
            "train.renderer_name: this run used qwen3_instruct and this start names chat_template",
        ),
    ],
)
def test_a_resume_that_changes_model_or_renderer_is_refused_before_any_service(
    tmp_path, monkeypatch, capsys, request, override, message
):
    from platoon.local_server import process
    from platoon.renderers.tokenizers import get_tokenizer, register_tokenizer, unregister_tokenizer
    from platoon.rollouts.records import write_identity
    from platoon.train.tinker.checkpoints import CheckpointLog

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    # another model the local server can serve: the start's own check of the model passes, the resume's refuses it
    register_tokenizer("platoon/other", lambda: get_tokenizer("platoon/toy"))
    request.addfinalizer(lambda: unregister_tokenizer("platoon/other"))
    started: list[str] = []
    monkeypatch.setattr(process, "LocalServerChild", lambda **kw: started.append("server"))
    run = _run_dir(tmp_path)
    run.mkdir(parents=True)
    write_identity(run, "platoon/toy", "qwen3_instruct")
    CheckpointLog(run).record(
        "000001",
        kind="permanent",
        batch=1,
        state_path="tinker://m/weights/000001",
        sampler_path="tinker://m/sampler_weights/000001",
    )
    before = (run / "checkpoints.jsonl").read_text()
    assert main(["train", str(EXAMPLE), f"log_path={tmp_path}", override]) == 78
    lines = [line for line in capsys.readouterr().err.splitlines() if "site profile" not in line]
    # the start's info lines: the sample timeout, what a quiet start is doing
    lines = [
        line
        for line in lines
        if not line.startswith("platoon: sample timeout")
        and not re.fullmatch(r"platoon: .* \(\d+ s\)\.\.\.", line)
    ]
    assert len(lines) == 1 and lines[0].startswith(f"platoon: {message}"), lines
    assert started == []  # refused before the local server (or any Tinker session) started
    lock = json.loads((run / "lock.json").read_text())
    assert lock["resume_refused"]["identity"]["model"] == "platoon/toy"
    assert (run / "checkpoints.jsonl").read_text() == before
    assert json.loads((run / "identity.json").read_text())["renderer"] == "qwen3_instruct"
    assert not (run / "config.resolved.yaml").exists()  # the run's own record is left as it was
    assert not (run / "process.json").exists()


class _RecordedServer:
    """The real local server child, recording when it was started and when its URL was asked for."""

    def __init__(self, events: list[str], started: list[Any]) -> None:
        from platoon.local_server.process import LocalServerChild

        self.events, self.started, self.real = events, started, LocalServerChild

    def __call__(self, **kwargs: Any) -> Any:
        events = self.events

        class Recorded(self.real):  # type: ignore[name-defined,misc]
            def url(self, **kw: Any) -> str:
                events.append("server url asked")
                return super().url(**kw)

        events.append("server started")
        child = Recorded(**kwargs)
        self.started.append(child)
        return child


def _record_listing(monkeypatch: Any, events: list[str]) -> None:
    from platoon.train.tinker import task_order

    listing = task_order.list_training_tasks

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        events.append("tasks listed")
        return await listing(*args, **kwargs)

    monkeypatch.setattr(task_order, "list_training_tasks", recorded)


@pytest.mark.slow
def test_the_local_server_starts_before_the_tasks_are_listed(site, monkeypatch, capsys):
    """Its start-up (importing torch, building the model) overlaps the start's own: the child is started before
    the listing, and its URL is asked for only once the start needs the service."""
    from platoon.local_server import process

    events: list[str] = []
    started: list[Any] = []
    monkeypatch.setattr(process, "LocalServerChild", _RecordedServer(events, started))
    _record_listing(monkeypatch, events)
    assert main(_small(site, "train.max_training_steps=1")) == 0, capsys.readouterr().err
    assert events == ["server started", "tasks listed", "server url asked"]
    err = capsys.readouterr().err
    assert err.index("starting the local Tinker-compatible server") < err.index("step 1/1")
    assert started[0]._child.poll() is not None  # stopped with the start


def test_a_refusal_after_the_listing_stops_the_early_local_server(site, monkeypatch, capsys):
    """A start refused once its tasks are listed (a batch larger than the training set) stops the server it
    started beside the listing; nothing asked for its URL."""
    from platoon.local_server import process

    events: list[str] = []
    started: list[Any] = []
    monkeypatch.setattr(process, "LocalServerChild", _RecordedServer(events, started))
    _record_listing(monkeypatch, events)
    assert main(["train", str(EXAMPLE), f"log_path={site}", "train.batch_size=100"]) == 78
    assert "train.batch_size" in capsys.readouterr().err
    assert events == ["server started", "tasks listed"]
    assert started[0]._child.poll() is not None


def test_the_heartbeat_says_what_a_quiet_start_is_doing(monkeypatch, capsys):
    """While a start prepares, a line comes whenever it has said nothing for HEARTBEAT_SECONDS (0 here): what it
    is doing, for how long."""
    from platoon.train.tinker import heartbeat

    monkeypatch.setattr(heartbeat, "HEARTBEAT_SECONDS", 0.0)
    beat = heartbeat.Heartbeat()
    beat.doing("listing tasks")
    beat.start()
    try:
        deadline = time.monotonic() + 30  # a hang guard
        while "listing tasks (" not in (err := capsys.readouterr().err) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        beat.stop()
    assert "platoon: listing tasks (" in err and err.rstrip().endswith("s)...")


TWO_CALLS = "test-trainer-two-calls"


@harness(TWO_CALLS)
async def _two_calls(ctx: Any) -> AgentResult:
    """Two calls on a growing conversation (the second prompt extends the first call's tokens), then answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    first = await ctx.chat(messages, max_tokens=2)
    messages += [{"role": "assistant", "content": first.text or ""}, {"role": "user", "content": "again"}]
    second = await ctx.chat(messages, max_tokens=1)
    await ctx.call_tool("answer", {"letter": second.text or ""})
    return AgentResult(final_message=second.text)


@pytest.mark.slow
def test_datum_stats_show_prefix_merging_on_a_multi_call_episode(site, capsys):
    harness(TWO_CALLS)(
        _two_calls
    )  # again: another test may have cleared the registry since this module loaded
    # Whether a call merges depends on what the toy model samples: a first reply cut at max_tokens merges only when
    # its plain re-render gives back the sampled tokens (about a third of the time), so 8 rollouts saw no merge
    # once in a CI run; 32 make that about 1e-5.
    argv = _small(
        site,
        "train.max_training_steps=1",
        "checkpoint.every=0",
        "train.batch_size=4",
        "train.workflow_config.group_size=8",
        f"environments=[{{env: platoon-bandit, harness: {TWO_CALLS}}}]",
    )
    assert main(argv) == 0, capsys.readouterr().err
    (row,) = _rows(_run_dir(site) / "metrics.jsonl")
    rollouts = 4 * 8
    assert row["train/datums/calls"] == 2 * rollouts
    before, after = row["train/datums/tokens_before_merge"], row["train/datums/tokens_after_merge"]
    print(f"tokens before merging {before}, after {after}; merged calls {row['train/datums/merged_calls']}")
    assert after <= before
    assert row["train/datums/merged_calls"] > 0 and after < before
    assert row["train/datums/postmerge_datums"] == rollouts * 2 - row["train/datums/merged_calls"]


# ---------------------------------------------------------------------------------------------------------------
# keep_recovery pruning


class _Rest:
    """A checkpoint-delete double: records deletions; `status` makes every delete fail with that HTTP status."""

    def __init__(self, status: int | None = None) -> None:
        self.deleted: list[str] = []
        self.status = status

    async def delete(self, path: str) -> None:
        if self.status is not None:
            error = RuntimeError(f"HTTP {self.status}")
            error.status_code = self.status  # type: ignore[attr-defined]
            raise error
        self.deleted.append(path)


def _recovery_log(run: Path) -> Any:
    from platoon.train.tinker.checkpoints import CheckpointLog

    checkpoints = CheckpointLog(run)
    checkpoints.record(
        "000001",
        kind="permanent",
        batch=1,
        state_path="tinker://m/weights/000001",
        sampler_path="tinker://m/sampler_weights/000001",
        policy_version=1,
    )
    for batch in (2, 3, 4):
        name = f"recovery-{batch:06d}"
        checkpoints.record(
            name,
            kind="recovery",
            batch=batch,
            state_path=f"tinker://m/weights/{name}",
            sampler_path=f"tinker://m/sampler_weights/{name}",
            policy_version=batch,
        )
    return checkpoints


def test_pruning_deletes_old_recovery_checkpoints_and_never_a_protected_one(tmp_path):
    import asyncio

    from platoon.train.tinker.pruning import Pruner

    checkpoints = _recovery_log(tmp_path)
    rest = _Rest()
    pruner = Pruner(checkpoints, keep=1, max_staleness=0, delete=rest.delete)
    asyncio.run(pruner.prune(4))
    # Kept: the permanent one, and recovery-000004 (the newest, the resume point, the policy sampled now).
    assert rest.deleted == [
        "tinker://m/weights/recovery-000002",
        "tinker://m/sampler_weights/recovery-000002",
        "tinker://m/weights/recovery-000003",
        "tinker://m/sampler_weights/recovery-000003",
    ]
    assert [r["result"] for r in _rows(tmp_path / "checkpoints_deleted.jsonl")] == ["deleted"] * 4
    assert pruner.metrics() == {
        "checkpoint/deleted": 4.0,
        "checkpoint/delete_failures": 0.0,
        "checkpoint/pruning": 1.0,
        "checkpoint/recovery_kept": 1.0,
    }
    asyncio.run(pruner.prune(4))  # a second pass finds nothing left to delete
    assert len(rest.deleted) == 4


def test_a_service_without_deletes_stops_pruning_for_the_start(tmp_path):
    import asyncio

    from platoon.train.tinker.pruning import Pruner

    rest = _Rest(status=405)
    pruner = Pruner(_recovery_log(tmp_path), keep=1, max_staleness=0, delete=rest.delete)
    asyncio.run(pruner.prune(4))
    assert pruner.metrics()["checkpoint/pruning"] == 0.0
    assert not (tmp_path / "checkpoints_deleted.jsonl").exists()
