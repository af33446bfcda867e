"""Step budgets of an agent tree: `linear` budgets count descendants and reserve `max_steps + 1`
on the spawner for each live child; `depth_aware` budgets count each agent alone and only bound the depth.

Every operation is synchronous and runs under one lock, so concurrent spawns are atomic and a release can happen
in a `finally` before any cleanup await.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["BUDGET_GUIDANCE", "AgentBudget", "BudgetError", "BudgetTracker", "Reservation"]

BudgetMode = Literal["linear", "depth_aware"]
BudgetReason = Literal["step_budget", "depth", "verifier_depth"]

#: The guidance a refused step reservation carries: the model reads it and can adapt.
BUDGET_GUIDANCE = (
    "Note: spawning a subagent automatically reserves max_steps + 1 steps since you will need one or more "
    "steps to process the result of the subagent and complete the task. "
    "You could try requesting a smaller budget or perform the task yourself."
)
_DEPTH_GUIDANCE = "Subagents may not be nested any deeper: perform the task yourself."
_VERIFIER_GUIDANCE = "A verifier's helper may not launch subagents: perform the check yourself."

# Verifier levels: policy agents are 0; a verifier root 1; its helpers 2 (which may not spawn again).
_POLICY, _VERIFIER_ROOT, _VERIFIER_HELPER = 0, 1, 2


class BudgetError(Exception):
    """A refused reservation or launch: `reason` is `step_budget`, `depth` or `verifier_depth`."""

    def __init__(self, reason: BudgetReason, message: str, guidance: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.guidance = guidance


@dataclass(eq=False)
class Reservation:
    """Steps held on `holder` for one live child; released once (later releases are no-ops)."""

    holder: AgentBudget
    amount: int
    released: bool = False


@dataclass(eq=False)
class AgentBudget:
    """One agent's node in the tracker; implements the `Budget` protocol a harness sees (`remaining`, `used`)."""

    tracker: BudgetTracker = field(repr=False)
    agent_id: str
    allocation: int | None  # None or 0: unbounded
    steps: Callable[[], int] = field(
        repr=False
    )  # the agent's own policy steps so far (read from its gateway record)
    depth: int = 0
    parent: AgentBudget | None = field(default=None, repr=False)
    verifier_level: int = _POLICY
    children: list[AgentBudget] = field(default_factory=list, repr=False)
    reserved: int = 0

    def remaining(self) -> float:
        """Allocation minus used (recursive under linear) minus reserved; `inf` when unbounded."""
        with self.tracker._lock:
            return self.tracker._remaining(self)

    def used(self) -> int:
        """Policy steps used; under linear budgets the descendants' steps count too."""
        with self.tracker._lock:
            return self.tracker._used(self)


class BudgetTracker:
    """The step budgets of one rollout's agent tree.

    `mode` is `linear` or `depth_aware`; `max_depth` bounds the policy tree (root 0; None = unlimited).
    Verifier roots and one level of their helpers are exempt from `max_depth`; a helper may not spawn.
    """

    def __init__(self, mode: BudgetMode = "linear", max_depth: int | None = None) -> None:
        if mode not in ("linear", "depth_aware"):
            raise ValueError(f"budget mode must be 'linear' or 'depth_aware'; got {mode!r}")
        self.mode: BudgetMode = mode
        self.max_depth = max_depth
        # A plain lock: every operation is synchronous (never held across an await), so it also stays safe if
        # a harness calls in from a thread.
        self._lock = threading.Lock()
        self._nodes: dict[str, AgentBudget] = {}

    # ---- the tree

    def add_agent(
        self,
        agent_id: str,
        *,
        max_steps: int | None,
        steps: Callable[[], int],
        parent: AgentBudget | None = None,
        verifier: bool = False,
    ) -> AgentBudget:
        """Register an agent; `steps()` returns its own policy-step count. A verifier child is a verifier root."""
        with self._lock:
            if parent is None:
                level = _POLICY
            elif parent.verifier_level:
                level = _VERIFIER_HELPER
            else:
                level = _VERIFIER_ROOT if verifier else _POLICY
            node = AgentBudget(
                tracker=self,
                agent_id=agent_id,
                allocation=max_steps or None,
                steps=steps,
                depth=0 if parent is None else parent.depth + 1,
                parent=parent,
                verifier_level=level,
            )
            if parent is not None:
                parent.children.append(node)
            self._nodes[agent_id] = node
            return node

    def get(self, agent_id: str) -> AgentBudget:
        return self._nodes[agent_id]

    def forget_nodes(self) -> None:
        """Forget the nodes once the episode has ended: each node points back at the tracker, a cycle that would
        otherwise wait for a full garbage collection."""
        with self._lock:
            self._nodes.clear()

    # ---- accounting (call with the lock held)

    def _used(self, node: AgentBudget) -> int:
        if self.mode == "depth_aware":
            return node.steps()
        # Iterative walk: trees are small, and recursion depth is then never a concern.
        total, stack = 0, [node]
        while stack:
            current = stack.pop()
            total += current.steps()
            stack.extend(current.children)
        return total

    def _remaining(self, node: AgentBudget) -> float:
        if not node.allocation:
            return math.inf
        if self.mode == "depth_aware":
            return float(node.allocation - node.steps())
        return float(node.allocation - self._used(node) - node.reserved)

    # ---- launches

    def check_depth(self, spawner: AgentBudget, *, verifier: bool = False) -> None:
        """Raise `BudgetError` when `spawner` may not launch a child (beyond `max_depth`, or a verifier's helper)."""
        if spawner.verifier_level == _VERIFIER_HELPER:
            raise BudgetError(
                "verifier_depth", "A verifier's helper cannot launch further subagents.", _VERIFIER_GUIDANCE
            )
        if verifier or spawner.verifier_level == _VERIFIER_ROOT:
            return  # a verifier root, and one level of its helpers, are always admissible
        if self.max_depth is not None and spawner.depth + 1 > self.max_depth:
            raise BudgetError(
                "depth",
                f"The maximum subagent depth ({self.max_depth}) is reached at depth {spawner.depth}.",
                _DEPTH_GUIDANCE,
            )

    def reserve(self, spawner: AgentBudget, child_max_steps: int, *, verifier: bool = False) -> Reservation:
        """Check the depth and, under linear budgets, hold `child_max_steps + 1` on the spawner; atomic.

        Depth-aware budgets hold nothing. Verifier roots hold nothing either: they grade a finished child whose
        own budget is spent, so holding steps would refuse every verifier.
        """
        with self._lock:
            self.check_depth(spawner, verifier=verifier)
            if self.mode == "depth_aware" or verifier:
                return Reservation(spawner, 0)
            amount = child_max_steps + 1
            remaining = self._remaining(spawner)
            if remaining < amount:
                raise BudgetError(
                    "step_budget",
                    f"Requested {amount} steps (max_steps {child_max_steps} + 1) but only "
                    f"{max(int(remaining), 0)} remain.",
                    BUDGET_GUIDANCE,
                )
            spawner.reserved += amount
            return Reservation(spawner, amount)

    def release(self, reservation: Reservation) -> None:
        """Return a reservation's steps; synchronous and idempotent, so it is safe in any `finally`."""
        with self._lock:
            if reservation.released:
                return
            reservation.released = True
            reservation.holder.reserved -= reservation.amount
