"""Harbor grading that agents cannot forge (docs/harbor.md, "Grading", says what each verifier mode trusts).

`grade_shared(...)` runs under an exclusive turn of the session's gate: it kills every process the agents left,
checks the workdir from `/`, makes `/tests` and `/logs/verifier` afresh, uploads the tests only now, runs
`test.sh`, kills again, and reads the outputs *inside the sandbox, by its own shell, from `/`*, classifying each
file (a regular file reached through no symlink, missing, a symlink, special, under a mount, unreadable, too large)
before reading a byte. The verdict then follows a fixed order (timeout, forged reward files, the classifiers that
tell a broken verifier environment from a failed agent, the reward contract). Every infrastructure failure is an
untrainable outcome; the zeros platoon gives itself (a deleted workdir, a forged reward file) carry
`metadata.platoon_zero`; every verifier run keeps its evidence (exit code, seconds, output tail) in
`metadata.evidence`. `grade_separate(...)` runs the same tests in a fresh verifier sandbox holding only the agent's
artifacts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.config import resolve_import_string
from platoon.envs.service import Outcome
from platoon.errors import ConfigError
from platoon_harbor.users import give

__all__ = [
    "COMMON_GROUPS",
    "REWARD_FILES",
    "Classifier",
    "FileRead",
    "RewardContract",
    "VerifierRun",
    "classify",
    "parse_classifiers",
    "read_outputs",
    "verdict",
]

#: reward files, read whole when at most this large
REWARD_FILES = ("reward.json", "reward.txt")
REWARD_MAX_BYTES = 1024 * 1024
#: log files, of which the last LOG_TAIL_BYTES are read
LOG_FILES = ("test-stdout.txt", "test-stderr.txt", "stdout.txt", "stderr.txt")
LOG_TAIL_BYTES = 1024 * 1024
#: the characters of the test output kept in the outcome metadata
TEST_OUTPUT_CHARS = 4096
#: the bytes of the verifier's output kept as the outcome's evidence (`metadata.evidence.output`)
EVIDENCE_BYTES = 16 * 1024
VERIFIER_DIR = "/logs/verifier"
RESERVED_KEYS = ("invalid", "failure_kind")

# The classes of a verifier output file.
REGULAR, MISSING, SYMLINK, SPECIAL, MOUNT, UNREADABLE, TOO_LARGE = (
    "regular",
    "missing",
    "symlink",
    "special",
    "mount",
    "unreadable",
    "too_large",
)

# Run by the sandbox's own bash, from `/`, after every process the agents left was killed: nothing can change a
# file between its check and its read. Each file gets one header line `name class size` and, when read, one line of
# base64. Regular files are opened only after `-L` and `-f` say they are a regular file reached through no symlink
# (a FIFO is never opened, so it cannot block the read). Paths are written out literally so that the process
# provider translates them like any sandbox path.
READ_SCRIPT = r"""
cd / || exit 90
command -v base64 >/dev/null 2>&1 || { echo "no base64 in the sandbox" >&2; exit 91; }
dir=/logs/verifier
dirclass=ok
if [ -L /logs ] || [ -L "$dir" ]; then dirclass=symlink
elif [ ! -d "$dir" ]; then dirclass=special
fi
mounted=no
if [ -r /proc/self/mountinfo ]; then
  while read -r _ _ _ _ point _; do
    case "$point" in "$dir"|"$dir"/*) mounted=yes ;; esac
  done < /proc/self/mountinfo
fi
emit() {  # name max mode(whole|tail)
  f="$dir/$1"
  if [ "$dirclass" != ok ]; then
    if [ -e "$f" ] || [ -L "$f" ]; then echo "$1 $dirclass 0"; else echo "$1 missing 0"; fi
    return
  fi
  if [ -L "$f" ]; then echo "$1 symlink 0"; return; fi
  if [ ! -e "$f" ]; then echo "$1 missing 0"; return; fi
  if [ "$mounted" = yes ]; then echo "$1 mount 0"; return; fi
  if [ ! -f "$f" ]; then echo "$1 special 0"; return; fi
  size=$(wc -c < "$f" 2>/dev/null) || { echo "$1 unreadable 0"; return; }
  size=$((size + 0))
  if [ "$3" = whole ] && [ "$size" -gt "$2" ]; then echo "$1 too_large $size"; return; fi
  if [ "$3" = whole ]; then data=$(base64 -w0 < "$f" 2>/dev/null) || { echo "$1 unreadable $size"; return; }
  else data=$(tail -c "$2" < "$f" | base64 -w0 2>/dev/null) || { echo "$1 unreadable $size"; return; }
  fi
  echo "$1 regular $size"
  echo "${data:--}"
}
"""


def read_script() -> str:
    """The whole reading script: READ_SCRIPT plus one `emit` per reward and log file."""
    calls = [f"emit {name} {REWARD_MAX_BYTES} whole" for name in REWARD_FILES]
    calls += [f"emit {name} {LOG_TAIL_BYTES} tail" for name in LOG_FILES]
    return READ_SCRIPT + "\n".join(calls) + "\nexit 0\n"


@dataclass(frozen=True)
class FileRead:
    """One verifier output file as the sandbox's shell found it."""

    name: str
    kind: str
    size: int = 0
    data: bytes | None = None

    @property
    def text(self) -> str:
        return (self.data or b"").decode("utf-8", errors="replace")


class OutputError(Exception):
    """The reading script's output could not be understood (infra `verifier_output`)."""


def parse_read(stdout: str) -> dict[str, FileRead]:
    """The reading script's stdout as files by name."""
    out: dict[str, FileRead] = {}
    lines = stdout.splitlines()
    i = 0
    known = {*REWARD_FILES, *LOG_FILES}
    kinds = {REGULAR, MISSING, SYMLINK, SPECIAL, MOUNT, UNREADABLE, TOO_LARGE}
    while i < len(lines):
        parts = lines[i].split(" ")
        i += 1
        if len(parts) != 3 or parts[0] not in known or parts[1] not in kinds or not parts[2].isdigit():
            raise OutputError(f"unexpected line from the reading script: {lines[i - 1][:200]!r}")
        name, kind, size = parts[0], parts[1], int(parts[2])
        data = None
        if kind == REGULAR:
            if i >= len(lines):
                raise OutputError(f"the reading script gave no content for {name}")
            encoded = lines[i]
            i += 1
            try:
                data = b"" if encoded == "-" else base64.b64decode(encoded, validate=True)
            except ValueError as exc:
                raise OutputError(f"undecodable content for {name}: {exc}") from None
        out[name] = FileRead(name, kind, size, data)
    missing = known - set(out)
    if missing:
        raise OutputError(f"the reading script did not report {', '.join(sorted(missing))}")
    return out


async def read_outputs(sandbox: Any) -> dict[str, FileRead]:
    """Classify and read the verifier outputs inside `sandbox`; raises `OutputError` when that fails."""
    try:
        result = await sandbox.exec(read_script(), timeout_s=120, cwd="/")
    except Exception as exc:
        raise OutputError(f"reading the verifier output failed: {type(exc).__name__}: {exc}") from exc
    if result.timed_out or result.exit_code != 0:
        raise OutputError(
            f"reading the verifier output failed (exit {result.exit_code}"
            f"{', timed out' if result.timed_out else ''}): {result.stderr.strip()[:500]}"
        )
    return parse_read(result.stdout)


# --- the reward contract ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardContract:
    """`service_kwargs.reward`: the primary name(s), the allowed components, a range, a check hook."""

    primaries: tuple[str, ...] = ("reward",)
    listed: bool = False  # a list of primaries (exactly one reported) rather than one name
    components: tuple[str, ...] | None = None
    range: tuple[float, float] | None = None
    check: str | None = None

    @property
    def first(self) -> str:
        """The name platoon-given zeros go under."""
        return self.primaries[0]

    @classmethod
    def parse(cls, value: Any, where: str = "service_kwargs.reward") -> RewardContract:
        if value is None:
            return cls()
        if isinstance(value, str):
            if not value:
                raise ConfigError(f"{where}: a reward name must be non-empty")
            return cls((value,))
        if isinstance(value, list):
            return cls(_names(value, where), listed=True)
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{where}: a name, a list of names, or a table {{primary, components, range, check}}"
            )
        unknown = set(value) - {"primary", "components", "range", "check"}
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))} (primary, components, range, check)"
            )
        primary = value.get("primary", "reward")
        primaries: tuple[str, ...]
        if isinstance(primary, str) and primary:
            primaries, listed = (primary,), False
        elif isinstance(primary, list):
            primaries, listed = _names(primary, f"{where}.primary"), True
        else:
            raise ConfigError(f"{where}.primary: a name or a list of names")
        components = value.get("components")
        if components is not None:
            components = _names(components, f"{where}.components")
            missing = [p for p in primaries if p not in components]
            if missing:
                raise ConfigError(
                    f"{where}.components: must include the primary name(s) {', '.join(missing)}"
                )
        bounds = value.get("range")
        if bounds is not None:
            if (
                not isinstance(bounds, list)
                or len(bounds) != 2
                or not all(_is_number(b) for b in bounds)
                or bounds[0] > bounds[1]
            ):
                raise ConfigError(f"{where}.range: [lo, hi] with lo <= hi")
            bounds = (float(bounds[0]), float(bounds[1]))
        check = value.get("check")
        if check is not None and (not isinstance(check, str) or ":" not in check):
            raise ConfigError(f"{where}.check: a `module:function` reference")
        return cls(primaries, listed, components, bounds, check)


def _names(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: a non-empty list of reward names")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: names a reward twice")
    return tuple(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- log classifiers --------------------------------------------------------------------------------------------

#: the file `test.sh`'s own stderr is copied to while the tests run (its stdout and stderr still go, interleaved, to
#: test-stdout.txt); the built-in classifiers read only this stream (see `Classifier`)
VERIFIER_STDERR = "test-stderr.txt"
#: exit codes of a `test.sh` killed from outside: 128 + SIGHUP, SIGINT, SIGKILL (the OOM killer), SIGTERM. Crashes
#: (SIGSEGV, SIGABRT, ...) are left out: the program that crashed may be the agent's code under test.
KILLED_BY_SIGNAL = frozenset({129, 130, 137, 143})


@dataclass(frozen=True)
class Classifier:
    """One rule that turns a verifier run into an infrastructure outcome of `kind`.

    A `pattern` is a multiline regex, over `test.sh`'s own stderr when `stderr_only` (the built-in rules: a test
    runner reports the agent's code on stdout, so the agent's prints rarely reach this stream), else over every log
    tail (`{pattern, kind}` entries of a config). `exit_rule` reads the exit code instead:
    `signal` (killed from outside) or `nonzero_after_reward` (a reward was written, then `test.sh` failed)."""

    kind: str
    pattern: str | None = None
    stderr_only: bool = False
    exit_rule: str | None = None

    def matches(self, run: VerifierRun) -> bool:
        if self.exit_rule == "signal":
            return run.exit_code in KILLED_BY_SIGNAL
        if self.exit_rule == "nonzero_after_reward":
            return run.exit_code not in (None, 0) and _reward_written(run.files)
        assert self.pattern is not None
        names = (VERIFIER_STDERR,) if self.stderr_only else LOG_FILES
        regex = re.compile(self.pattern, re.MULTILINE)
        return any(
            regex.search(run.files[name].text)
            for name in names
            if name in run.files and run.files[name].kind == REGULAR
        )


#: the test runners, interpreters and installers a `test.sh` calls. Only these count as a missing tool: a command
#: the task asks the agent to provide (a script in the workdir, a CLI it installs) is the agent's to make.
_TOOLS = r"(uv|uvx|pytest|pip3?|python3?(\.\d+)?|node|npm|npx|curl|wget|apt-get)"
_SYSTEM_DIRS = r"/(usr/(local/)?)?s?bin/"
#: bash names the script a line failed in: only the tests' own scripts count, not a script of the agent's they run
#: (whose missing `uvx` or shebang interpreter is the agent's choice). The process provider writes host paths.
_TESTS_SCRIPT = r"\S*/tests/\S+"


def _stderr(kind: str, *patterns: str) -> tuple[Classifier, ...]:
    """One classifier of `kind` over test.sh's stderr, matching any of `patterns`."""
    return (Classifier(kind, "|".join(f"(?:{pattern})" for pattern in patterns), stderr_only=True),)


#: The built-in groups, by the name a config gives them. The patterns are the messages of resolvers, package
#: managers and bash itself, never a test's assertion text: a failed agent must not look like a broken environment.
#: `bash` writes "<script>: line N: <tool>: command not found" for a missing tool and "... No such file or
#: directory" for a missing interpreter named by its path.
COMMON_GROUPS: dict[str, tuple[Classifier, ...]] = {
    "network": _stderr(
        "verifier_network",
        r"Could not resolve host|Could not resolve '[^']+'|Temporary failure (in name resolution|resolving)",
        r"Name or service not known|nodename nor servname provided|unable to resolve host address",
        r"Network is unreachable|getaddrinfo (EAI_AGAIN|ENOTFOUND)|^npm (ERR!|error) code E(AI_AGAIN|NOTFOUND)",
    ),
    "download": _stderr(
        "verifier_download",
        r"Could not find a version that satisfies the requirement|No matching distribution found for",
        r"^E: (Unable to locate package|Failed to fetch|Package '[^']+' has no installation candidate)",
        r"^npm (ERR!|error) (code E(CONNREFUSED|CONNRESET|TIMEDOUT)|network)",
        r"Failed to (download|fetch)[: ].*(https?://|pypi|index)",
    ),
    "missing-tool": _stderr(
        "verifier_missing_tool",
        rf"^{_TESTS_SCRIPT}: line \d+: {_TOOLS}: (command )?not found$",
        rf"^{_TESTS_SCRIPT}: line \d+: {_SYSTEM_DIRS}{_TOOLS}: No such file or directory$",
        r"No module named '?pytest'?",
    ),
    "timeout": _stderr(
        "verifier_grader_timeout", r"subprocess\.TimeoutExpired|timed out after \d+(\.\d+)? ?s(econds)?"
    ),
    "signal": (Classifier("verifier_signal", exit_rule="signal"),),
    "exit-nonzero": (Classifier("verifier_exit_nonzero", exit_rule="nonzero_after_reward"),),
}
#: the name of the whole built-in set, the default
COMMON = "harbor-common"
DEFAULT_CLASSIFIERS: tuple[Classifier, ...] = tuple(c for group in COMMON_GROUPS.values() for c in group)
#: `verifier_classifiers: off` (or `[]`) turns classification off
OFF = "off"


def parse_classifiers(
    value: Any, where: str = "service_kwargs.verifier_classifiers"
) -> tuple[Classifier, ...]:
    """The classifiers a config names: absent → the built-in set; `off` or `[]` → none; else a list (or one item)
    of `harbor-common`, built-in group names and `{pattern, kind}` entries, in that order. Patterns compile now."""
    if value is None or value == COMMON:
        return DEFAULT_CLASSIFIERS
    if value == OFF:
        return ()
    items = value if isinstance(value, list) else [value]
    names = ", ".join([COMMON, *COMMON_GROUPS])
    out: list[Classifier] = []
    for i, item in enumerate(items):
        if item == COMMON:
            out.extend(DEFAULT_CLASSIFIERS)
            continue
        if isinstance(item, str) and item in COMMON_GROUPS:
            out.extend(COMMON_GROUPS[item])
            continue
        if not isinstance(item, Mapping) or set(item) != {"pattern", "kind"}:
            raise ConfigError(
                f"{where}[{i}]: {item!r} is not a classifier; give `off`, or a list of {names} or "
                "{pattern, kind} tables"
            )
        pattern, kind = item["pattern"], item["kind"]
        if not isinstance(pattern, str) or not isinstance(kind, str) or not kind:
            raise ConfigError(f"{where}[{i}]: pattern and kind are strings")
        try:
            re.compile(pattern, re.MULTILINE)
        except re.error as exc:
            raise ConfigError(f"{where}[{i}].pattern: {exc}") from None
        out.append(Classifier(kind, pattern))
    return tuple(out)


def classify(run: VerifierRun, classifiers: Sequence[Classifier]) -> str | None:
    """The kind of the first classifier that matches the run, or None."""
    return next((c.kind for c in classifiers if c.matches(run)), None)


def _reward_written(files: Mapping[str, FileRead]) -> bool:
    return any(
        name in files and files[name].kind == REGULAR and files[name].text.strip() for name in REWARD_FILES
    )


# --- the verdict ------------------------------------------------------------------------------------------------


@dataclass
class VerifierRun:
    """What running the tests left: exit code, seconds, whether it timed out, the files as read."""

    exit_code: int | None
    seconds: float
    timed_out: bool
    files: dict[str, FileRead]
    mode: str = "shared"
    cwd_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        stdout = self.files.get("test-stdout.txt")
        out: dict[str, Any] = {
            "verifier_exit_code": self.exit_code,
            "verifier_seconds": round(self.seconds, 3),
            "test_output": stdout.text[-TEST_OUTPUT_CHARS:] if stdout and stdout.kind == REGULAR else "",
            "verifier_mode": self.mode,
        }
        out["evidence"] = self.evidence()
        if self.cwd_error:
            out["verifier_cwd_error"] = self.cwd_error
        out.update(self.extra)
        return out

    def evidence(self) -> dict[str, Any]:
        """What tells a broken environment from a failed agent, kept with the trajectory: the exit code, the
        seconds, the mode and the last 16 KiB of the verifier's output (stdout and stderr as they interleaved)."""
        stdout = self.files.get("test-stdout.txt")
        tail = (stdout.data or b"")[-EVIDENCE_BYTES:] if stdout and stdout.kind == REGULAR else b""
        return {
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "timed_out": self.timed_out,
            "mode": self.mode,
            "output": tail.decode("utf-8", errors="replace"),
        }


def platoon_zero(contract: RewardContract, reason: str, metadata: Mapping[str, Any]) -> Outcome:
    """A zero platoon gives itself, under the contract's first name, flagged `platoon_zero`."""
    return Outcome(
        "scored",
        {contract.first: 0.0},
        primary=contract.first,
        reason=reason,
        metadata={**metadata, "platoon_zero": True},
    )


def verdict(
    run: VerifierRun,
    contract: RewardContract,
    *,
    classifiers: Sequence[Classifier] = (),
    task: Any = None,
) -> Outcome:
    """The outcome of a verifier run, in the order of 6.7."""
    meta = run.metadata()
    if run.timed_out:
        return Outcome.infra(
            "verifier_timeout",
            status="invalid",
            reason="the tests ran past the verifier timeout",
            metadata=meta,
        )
    suspects = [f for name in REWARD_FILES if (f := run.files[name]).kind not in (REGULAR, MISSING)]
    if suspects:
        meta["reward_files"] = {f.name: f.kind for f in suspects}
        reason = (
            "reward_file_too_large"
            if all(f.kind == TOO_LARGE for f in suspects)
            else "reward_file_not_regular"
        )
        return platoon_zero(contract, reason, meta)
    kind = classify(run, classifiers)
    if kind is not None:
        return Outcome.infra(
            kind,
            status="invalid",
            reason=f"the verifier's environment failed ({kind}; exit {run.exit_code}), not the agent",
            metadata=meta,
        )
    return _contract_outcome(run.files, contract, meta, task)


def _read_rewards(files: Mapping[str, FileRead]) -> tuple[dict[str, Any] | None, str | None, bool]:
    """(rewards, a problem, whether both files were present). reward.json is preferred; an empty file is absent."""
    present = {
        name: files[name] for name in REWARD_FILES if files[name].kind == REGULAR and files[name].text.strip()
    }
    both = len(present) == 2
    if "reward.json" in present:
        try:
            data = json.loads(present["reward.json"].text)
        except ValueError as exc:
            return None, f"reward.json is not JSON ({exc})", both
        if not isinstance(data, dict):
            return None, "reward.json is not an object", both
        rewards: dict[str, Any] = {}
        for key, value in data.items():
            if key == "failure_kind":
                if not isinstance(value, str):
                    return None, "reward.json failure_kind is not a string", both
                rewards[key] = value
                continue
            if isinstance(value, bool):
                value = float(value)
            if not _is_number(value):
                return None, f"reward.json {key!r} is not a finite number ({value!r})", both
            rewards[key] = float(value)
        return rewards, None, both
    if "reward.txt" in present:
        text = present["reward.txt"].text.strip()
        try:
            value = float(text)
        except ValueError:
            return None, f"reward.txt is not one number ({text[:80]!r})", both
        if not math.isfinite(value):
            return None, f"reward.txt is not finite ({text[:80]!r})", both
        return {"reward": value}, None, both
    return None, "no reward.json or reward.txt (or both empty)", both


def _contract_outcome(
    files: Mapping[str, FileRead], contract: RewardContract, meta: dict[str, Any], task: Any
) -> Outcome:
    rewards, problem, both = _read_rewards(files)
    if rewards is None:
        return Outcome.infra("verifier_no_reward", reason=problem, metadata=meta)
    invalid = rewards.pop("invalid", None)
    failure_kind = rewards.pop("failure_kind", None)
    if invalid is not None and invalid >= 0.5:
        return Outcome.infra(
            failure_kind if isinstance(failure_kind, str) and failure_kind else "verifier_declared",
            status="invalid",
            reason="the verifier declared the run invalid",
            metadata=meta,
        )
    if contract.listed:
        if both:
            return Outcome.infra(
                "verifier_ambiguous_reward_files",
                status="invalid",
                reason="both reward.json and reward.txt were written",
                metadata=meta,
            )
        reported = [name for name in contract.primaries if name in rewards]
        if not reported:
            return Outcome.infra(
                "verifier_no_primary",
                reason=f"none of {', '.join(contract.primaries)} was reported",
                metadata=meta,
            )
        if len(reported) > 1:
            return Outcome.infra(
                "verifier_ambiguous_primary",
                status="invalid",
                reason=f"several primaries were reported: {', '.join(sorted(reported))}",
                metadata=meta,
            )
        primary = reported[0]
    else:
        primary = contract.primaries[0]
        if primary not in rewards:
            return Outcome.infra(
                "verifier_no_primary", reason=f"the reward {primary!r} was not reported", metadata=meta
            )
    if contract.components is not None:
        extra = sorted(set(rewards) - set(contract.components))
        if extra:
            return Outcome.infra(
                "verifier_unexpected_keys",
                status="invalid",
                reason=f"unexpected reward key(s): {', '.join(extra)}",
                metadata=meta,
            )
    if contract.range is not None:
        lo, hi = contract.range
        if not lo <= rewards[primary] <= hi:
            return Outcome.infra(
                "verifier_out_of_range",
                status="invalid",
                reason=f"{primary} = {rewards[primary]} is outside [{lo}, {hi}]",
                metadata=meta,
            )
    outcome = Outcome("scored", dict(rewards), primary=primary, metadata=meta)
    if contract.check is not None:
        return _run_check(contract.check, outcome, files, task, meta)
    return outcome


def _run_check(
    reference: str, outcome: Outcome, files: Mapping[str, FileRead], task: Any, meta: dict[str, Any]
) -> Outcome:
    try:
        hook = resolve_import_string(reference)
        # The hook sees the verifier directory as a host directory holding the files exactly as they were read.
        with tempfile.TemporaryDirectory(prefix="platoon-verifier-") as tmp:
            for f in files.values():
                if f.kind == REGULAR and f.data is not None:
                    (Path(tmp) / f.name).write_bytes(f.data)
            result = hook(dict(outcome.rewards), Path(tmp), task)
    except Exception as exc:
        return Outcome.infra(
            "verifier_contract",
            reason=f"the check hook {reference} raised {type(exc).__name__}: {exc}",
            metadata=meta,
        )
    if result is None:
        return outcome
    if not isinstance(result, Outcome):
        return Outcome.infra(
            "verifier_contract",
            reason=f"the check hook {reference} returned {type(result).__name__}, not an Outcome or None",
            metadata=meta,
        )
    return result


# --- the grading steps (shared mode) ----------------------------------------------------------------------------

# Reset /tests and /logs/verifier from `/`: a `/logs` that is a symlink or a file goes; permissions the agent took
# away are restored before `rm -rf`; then the directories are made afresh. Failing to remove something (a mount)
# is left to the reading script to classify.
RESET_SCRIPT = r"""
cd / || exit 90
for p in /logs /tests; do
  if [ -L "$p" ] || { [ -e "$p" ] && [ ! -d "$p" ]; }; then rm -f "$p" || exit 92; fi
done
mkdir -p /logs || exit 93
chmod u+rwx /logs 2>/dev/null
for d in /tests /logs/verifier; do
  if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d"; fi
  if [ -d "$d" ]; then chmod -R u+rwx "$d" 2>/dev/null; rm -rf "$d" 2>/dev/null; fi
  mkdir -p "$d" 2>/dev/null
done
[ -d /tests ] && [ ! -L /tests ] || exit 94
exit 0
"""

# Is the workdir there, a directory, and enterable? Run from `/` (the agent may have deleted it).
WORKDIR_SCRIPT = r"""
cd / || exit 90
if [ ! -e "$1" ] && [ ! -L "$1" ]; then echo missing; exit 0; fi
if [ ! -d "$1" ]; then echo "not a directory"; exit 0; fi
if ! ( cd "$1" ) 2>/dev/null; then echo "not enterable"; exit 0; fi
echo ok
"""


async def workdir_problem(sandbox: Any, workdir: str) -> str | None:
    """Why the workdir is unusable (missing, not a directory, not enterable), or None."""
    result = await sandbox.exec(
        ["bash", "-c", WORKDIR_SCRIPT, "platoon-workdir", workdir], timeout_s=60, cwd="/"
    )
    answer = result.stdout.strip()
    if result.exit_code != 0 or not answer:
        raise RuntimeError(
            f"checking the workdir failed (exit {result.exit_code}): {result.stderr.strip()[:300]}"
        )
    return None if answer == "ok" else answer


# A separate verifier image that bundles its tests (built from tests/Dockerfile) keeps its own /tests: the agent
# never reached that sandbox, and nothing uploads the tests again. Only /logs/verifier is made afresh there.
RESET_LOGS_SCRIPT = r"""
cd / || exit 90
if [ -L /logs ] || { [ -e /logs ] && [ ! -d /logs ]; }; then rm -f /logs || exit 92; fi
mkdir -p /logs || exit 93
chmod u+rwx /logs 2>/dev/null
d=/logs/verifier
if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d"; fi
if [ -d "$d" ]; then chmod -R u+rwx "$d" 2>/dev/null; rm -rf "$d" 2>/dev/null; fi
mkdir -p "$d" 2>/dev/null
exit 0
"""


async def reset_dirs(sandbox: Any, *, keep_tests: bool = False) -> None:
    result = await sandbox.exec(RESET_LOGS_SCRIPT if keep_tests else RESET_SCRIPT, timeout_s=120, cwd="/")
    if result.exit_code != 0:
        raise RuntimeError(
            f"resetting /tests and /logs/verifier failed (exit {result.exit_code}): {result.stderr.strip()[:300]}"
        )


async def remove_tests(sandbox: Any) -> None:
    """Always run after grading, also on failure or cancellation: agents never see the tests."""
    with contextlib.suppress(Exception):
        await asyncio.shield(
            sandbox.exec("cd / && chmod -R u+rwx /tests 2>/dev/null; rm -rf /tests", timeout_s=60, cwd="/")
        )


class GradeFailure(Exception):
    """A grading step failed: `kind` is the infra failure kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class SharedGrading:
    """The inputs of one shared-mode grading."""

    sandbox: Any
    workdir: str
    tests_dir: Path
    verifier_env: Mapping[str, str]
    timeout_s: float
    contract: RewardContract
    classifiers: Sequence[Classifier] = ()
    task: Any = None
    extra_metadata: Mapping[str, Any] = field(default_factory=dict)
    #: the user test.sh runs as (None: the sandbox's own); `sandbox` is then a view whose other steps run as root
    tests_user: str | None = None


async def grade_shared(g: SharedGrading) -> Outcome:
    """Grade in the agents' own sandbox (the caller holds an exclusive turn). Never raises for infra failures."""
    sandbox = g.sandbox
    base_meta = {"verifier_mode": "shared", **g.extra_metadata}
    try:
        return await _grade_shared(g, base_meta)
    except GradeFailure as exc:
        return Outcome.infra(exc.kind, reason=str(exc), metadata=base_meta)
    finally:
        await remove_tests(sandbox)


# `bash /tests/test.sh`, its stdout and stderr interleaved in test-stdout.txt as Harbor has them, and its stderr also
# copied to test-stderr.txt (the stream the built-in classifiers read); the exit code is test.sh's own. An image
# without `tee` gets the plain redirection.
RUN_TESTS = r"""
out=/logs/verifier/test-stdout.txt
if ! command -v tee >/dev/null 2>&1; then bash /tests/test.sh > "$out" 2>&1; exit $?; fi
: > "$out"
bash /tests/test.sh 2>&1 >> "$out" | tee -a "$out" > /logs/verifier/test-stderr.txt
exit "${PIPESTATUS[0]}"
"""


async def _run_tests(
    sandbox: Any,
    workdir: str,
    timeout_s: float | None,
    verifier_env: Mapping[str, str],
    user: str | None = None,
) -> tuple[int, bool, str | None, float]:
    """`bash /tests/test.sh` from the workdir (as `user` when given), its output in
    `/logs/verifier/test-stdout.txt`: (exit code, timed out, why the workdir could not be entered, seconds)."""
    started = time.monotonic()
    as_user = {"user": user} if user is not None else {}
    try:
        result = await sandbox.exec(
            RUN_TESTS,
            timeout_s=timeout_s,
            env=dict(verifier_env),
            cwd=workdir,
            **as_user,
        )
    except OSError as exc:
        # The process provider raises when the workdir cannot be entered (docker answers 126).
        return 126, False, str(exc), time.monotonic() - started
    return result.exit_code, result.timed_out, None, time.monotonic() - started


async def _kill(sandbox: Any, when: str) -> None:
    try:
        await sandbox.kill_processes()
    except Exception as exc:
        raise GradeFailure(
            sandbox_failure(exc, "verifier_isolation"), f"killing the agents' processes {when} failed: {exc}"
        ) from exc


def sandbox_failure(exc: BaseException, default: str) -> str:
    """The infra kind of a grading step's failure: the kind a sandbox error names (`sandbox_disk_limit` when the
    agent wrote past its disk limit, `sandbox_gone`), else `default`."""
    named = getattr(exc, "failure_kind", None)
    return named if isinstance(named, str) and named.startswith("sandbox_") else default


async def _grade_shared(g: SharedGrading, base_meta: dict[str, Any]) -> Outcome:
    sandbox = g.sandbox
    await _kill(sandbox, "before the tests")
    try:
        problem = await workdir_problem(sandbox, g.workdir)
    except Exception as exc:
        raise GradeFailure("verifier_setup", str(exc)) from exc
    if problem is not None:
        return platoon_zero(
            g.contract, "workdir_missing", {**base_meta, "verifier_cwd_error": f"{g.workdir}: {problem}"}
        )
    try:
        await reset_dirs(sandbox)
        await give(sandbox, g.tests_user, ["/logs/verifier"])
        await sandbox.upload(g.tests_dir, "/tests")
    except Exception as exc:
        raise GradeFailure("verifier_setup", f"{type(exc).__name__}: {exc}") from exc
    exit_code, timed_out, cwd_error, seconds = await _run_tests(
        sandbox, g.workdir, g.timeout_s, g.verifier_env, g.tests_user
    )
    await _kill(sandbox, "after the tests")
    if exit_code == 126:
        try:
            problem = await workdir_problem(sandbox, g.workdir)
        except Exception as exc:
            raise GradeFailure("verifier_setup", str(exc)) from exc
        if problem is not None:
            meta = {
                **base_meta,
                "verifier_exit_code": exit_code,
                "verifier_cwd_error": f"{g.workdir}: {problem}",
            }
            return platoon_zero(g.contract, "workdir_missing", meta)
    try:
        files = await read_outputs(sandbox)
    except OutputError as exc:
        raise GradeFailure("verifier_output", str(exc)) from exc
    run = VerifierRun(exit_code, seconds, timed_out, files, "shared", cwd_error, dict(g.extra_metadata))
    return verdict(run, g.contract, classifiers=g.classifiers, task=g.task)


# --- separate mode ----------------------------------------------------------------------------------------------

#: skipped artifacts listed in the outcome metadata (then a count)
SKIPPED_SHOWN = 20


@dataclass
class Collected:
    """Artifacts taken from the main sandbox: (where they go in the verifier, the host copy), and what was left out."""

    root: Path
    items: list[tuple[str, Path]] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {"artifacts": list(self.artifacts)}
        if self.skipped:
            out["artifacts_skipped"] = self.skipped[:SKIPPED_SHOWN]
            if len(self.skipped) > SKIPPED_SHOWN:
                out["artifacts_skipped_more"] = len(self.skipped) - SKIPPED_SHOWN
        return out


# Lists one artifact from `/`: its kind first (a symlink, missing or special source is reported, not followed), then
# after restoring the owner's permissions every entry below it as `type size path` NUL-separated.
LIST_SCRIPT = r"""
cd / || exit 90
src=$1
if [ -L "$src" ]; then printf 'SKIP symlink'; exit 0; fi
if [ ! -e "$src" ]; then printf 'SKIP missing'; exit 0; fi
if [ ! -d "$src" ] && [ ! -f "$src" ]; then printf 'SKIP special'; exit 0; fi
chmod -R u+rwX "$src" 2>/dev/null
printf 'OK\0'
find "$src" -printf '%y %s %p\0'
"""


async def collect_artifacts(
    sandbox: Any,
    artifacts: Sequence[tuple[str, str, Sequence[str]]],
    max_bytes: int,
    root: Path,
) -> Collected:
    """Take each `(source in main, destination in the verifier, exclude patterns)` out of `sandbox` by `tar` inside
    it: only directories and regular files, an artifact over `max_bytes` (measured before anything is written) left
    out whole, symlinks and special files left out and reported; unpacked on the host keeping only directories and
    regular files (hard links become copies)."""
    import fnmatch
    import posixpath
    import tarfile
    import uuid

    collected = Collected(root)
    for index, (source, destination, excludes) in enumerate(artifacts):
        listing = await sandbox.exec(
            ["bash", "-c", LIST_SCRIPT, "platoon-artifacts", source], timeout_s=300, cwd="/"
        )
        if listing.exit_code != 0:
            raise GradeFailure(
                "verifier_artifacts", f"listing artifact {source} failed: {listing.stderr.strip()[:300]}"
            )
        head, _, rest = listing.stdout.partition("\0")
        if head.startswith("SKIP"):
            if head != "SKIP missing" or source != "/logs/artifacts":
                collected.skipped.append(f"{source} ({head.split(' ', 1)[1]})")
            continue
        keep: list[str] = []
        total = 0
        for record in filter(None, rest.split("\0")):
            kind, size, path = record.split(" ", 2)
            rel = posixpath.relpath(path, source)
            if rel != "." and any(fnmatch.fnmatch(rel, pattern) for pattern in excludes):
                continue
            if kind == "f":
                total += int(size)
                keep.append(path)
            elif kind == "d":
                keep.append(path)
            else:
                collected.skipped.append(f"{path} ({'symlink' if kind == 'l' else 'special'})")
        if total > max_bytes:
            collected.skipped.append(f"{source} (too large: {total} bytes over {max_bytes})")
            continue
        tarball = f"/tmp/platoon-artifacts-{uuid.uuid4().hex[:12]}.tar"
        try:
            made = await sandbox.exec(
                ["tar", "--null", "--no-recursion", "-C", "/", "-cf", tarball, "-T", "-"],
                stdin="\0".join(p.lstrip("/") for p in keep),
                timeout_s=600,
                cwd="/",
            )
            if made.exit_code != 0:
                raise GradeFailure(
                    "verifier_artifacts", f"tar of artifact {source} failed: {made.stderr.strip()[:300]}"
                )
            local = root / f"{index}.tar"
            await sandbox.download(tarball, local)
        finally:
            with contextlib.suppress(Exception):
                await sandbox.exec(["rm", "-f", tarball], timeout_s=60, cwd="/")
        target = root / str(index)
        prefix = source.lstrip("/")
        with tarfile.open(local) as archive:
            for member in archive.getmembers():
                name = posixpath.normpath(member.name)
                if name.startswith(("/", "..")) or (name != prefix and not name.startswith(prefix + "/")):
                    continue
                rel = posixpath.relpath(name, prefix)
                out = target if rel == "." else target / rel
                if member.isdir():
                    out.mkdir(parents=True, exist_ok=True)
                elif member.isfile() or member.islnk():
                    data = archive.extractfile(member)
                    if data is None:
                        continue
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(data.read())
                    out.chmod(0o755 if member.mode & 0o111 else 0o644)
        local.unlink()
        if target.exists():
            collected.items.append((destination, target))
            collected.artifacts.append(source)
    return collected


@dataclass
class SeparateGrading:
    """The verifier-sandbox half of a separate-mode grading (the artifacts were collected from main already)."""

    start_verifier: Any  # async () -> sandbox
    workdir: str
    tests_dir: Path
    bundled_tests: bool
    verifier_env: Mapping[str, str]
    timeout_s: float
    contract: RewardContract
    collected: Collected
    #: empty the verifier's workdir before the artifacts go in (the workdir itself is the artifact)
    fresh_workdir: bool = False
    classifiers: Sequence[Classifier] = ()
    task: Any = None
    extra_metadata: Mapping[str, Any] = field(default_factory=dict)
    #: the user test.sh runs as (None: the verifier sandbox's own); `start_verifier` then returns a view whose other
    #: steps run as root
    tests_user: str | None = None


async def grade_separate(g: SeparateGrading) -> Outcome:
    """Start the verifier, place the artifacts, upload the tests unless bundled, run them; always stop it."""
    meta = {"verifier_mode": "separate", **g.extra_metadata, **g.collected.metadata()}
    try:
        sandbox = await g.start_verifier()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return Outcome.infra(
            "verifier_start", reason=f"the verifier did not start: {type(exc).__name__}: {exc}", metadata=meta
        )
    try:
        try:
            await reset_dirs(sandbox, keep_tests=g.bundled_tests)
            if g.fresh_workdir:
                cleared = await sandbox.exec(["rm", "-rf", "--", g.workdir], timeout_s=300, cwd="/")
                if cleared.exit_code != 0:
                    raise RuntimeError(f"emptying {g.workdir} failed: {cleared.stderr.strip()[:300]}")
            made = await sandbox.exec(["mkdir", "-p", g.workdir, "/logs/artifacts"], timeout_s=60, cwd="/")
            if made.exit_code != 0:
                raise RuntimeError(made.stderr.strip()[:300])
            await give(sandbox, g.tests_user, ["/logs/verifier"], if_empty=[g.workdir])
            for destination, host in g.collected.items:
                await sandbox.upload(host, destination)
            if not g.bundled_tests:
                await sandbox.upload(g.tests_dir, "/tests")
        except Exception as exc:
            return Outcome.infra("verifier_setup", reason=f"{type(exc).__name__}: {exc}", metadata=meta)
        exit_code, timed_out, cwd_error, seconds = await _run_tests(
            sandbox, g.workdir, g.timeout_s, g.verifier_env, g.tests_user
        )
        try:
            await sandbox.kill_processes()
        except Exception as exc:
            return Outcome.infra(
                sandbox_failure(exc, "verifier_isolation"),
                reason=f"killing after the tests failed: {exc}",
                metadata=meta,
            )
        try:
            files = await read_outputs(sandbox)
        except OutputError as exc:
            return Outcome.infra("verifier_output", reason=str(exc), metadata=meta)
        extra = {**g.extra_metadata, **g.collected.metadata()}
        run = VerifierRun(exit_code, seconds, timed_out, files, "separate", cwd_error, extra)
        return verdict(run, g.contract, classifiers=g.classifiers, task=g.task)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(sandbox.stop())
