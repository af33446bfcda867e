"""`platoon train` under `watchdog.max_restarts > 0`: this process holds the run dir and writes its records
(`supervised_training`), then the supervisor runs child starts, each `python -m platoon.startup.supervised_start
CONFIG`: the whole start (`training_start.train`) from the run's `config.resolved.yaml`, with the trainer's signal
contract installed, exiting with the trainer's code.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from platoon.config import load_config
from platoon.config.training import PlatoonTinkerRLTrainerConfig
from platoon.console import err
from platoon.errors import EX_USAGE, ConfigError, PlatoonError
from platoon.rollouts import records
from platoon.startup.training import run_dir_of
from platoon.startup.training_start import train
from platoon.train.tinker.supervised import install_signal_contract
from platoon.train.tinker.supervisor import supervise

if TYPE_CHECKING:
    from platoon.config.loader import LoadedConfig

__all__ = ["SUPERVISED_MODULE", "child_command", "main", "supervised_training"]

SUPERVISED_MODULE = "platoon.startup.supervised_start"


def child_command(run_dir: Path) -> list[str]:
    """The supervisor's child start: `python -m platoon.startup.supervised_start <run_dir>/config.resolved.yaml`."""
    return [sys.executable, "-m", SUPERVISED_MODULE, str(Path(run_dir) / records.RESOLVED_CONFIG_FILE)]


def supervised_training(config: PlatoonTinkerRLTrainerConfig, loaded: LoadedConfig) -> int:
    """Hold the run dir, write its records, then run supervised child starts from the snapshot; returns the last
    start's exit code."""
    run_dir = run_dir_of(config)
    # Refused (78) before anything is written; the child starts find this process as their parent and go on.
    problem = records.writable_dir_problem(run_dir, key="log_path")
    if problem is not None:
        raise ConfigError(problem)
    records.check_run_dir_free(run_dir)
    records.write_resolved_config(run_dir, loaded)
    records.write_lock(run_dir, loaded, [])
    records.hold_run_dir(run_dir)
    try:
        return supervise(run_dir, max_restarts=config.watchdog.max_restarts, command=child_command(run_dir))
    finally:
        held = records.read_process(run_dir)
        if held is not None and held.pid == os.getpid():
            (run_dir / records.PROCESS_FILE).unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Train from the resolved config named by the single argument; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(
            "platoon: usage: python -m platoon.startup.supervised_start <run dir>/config.resolved.yaml",
            file=sys.stderr,
        )
        return EX_USAGE
    install_signal_contract()
    try:
        loaded = load_config(args[0], kind="train")
        config = loaded.config
        if not isinstance(config, PlatoonTinkerRLTrainerConfig):
            raise ConfigError(f"{args[0]}: not a training config (its schema is {loaded.schema_name})")
        return asyncio.run(train(config, loaded=loaded))
    except PlatoonError as exc:
        err(str(exc))
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
