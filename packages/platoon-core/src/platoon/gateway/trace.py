"""The trace builder: a rollout's agent records become trainable trajectories (train.md 6.7, core.md 9.1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from platoon.envs.service import Outcome
    from platoon.gateway.core import RolloutRecorder
    from platoon.trajectory import TrajectoryCollection

__all__ = ["build_collection"]


def build_collection(rollout: RolloutRecorder, *, episode_outcome: Outcome) -> TrajectoryCollection:
    """One trajectory per kept agent, root first, then in opening order."""
    raise NotImplementedError
