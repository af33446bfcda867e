"""The per-live-env admission gate: classes, per-caller fairness, exclusive barriers, deadlines, cancellation, close."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from platoon.envs.gate import EnvBusy, Gate, GateClosed


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


class Recorder:
    """Operations that log their start and end and hold until released (or finish after a few loop turns)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.running: set[str] = set()
        self.max_parallel = 0

    def op(self, name: str, hold: asyncio.Event | None = None) -> Callable[[], Awaitable[str]]:
        async def body() -> str:
            self.log.append(f"+{name}")
            self.running.add(name)
            self.max_parallel = max(self.max_parallel, len(self.running))
            if hold is not None:
                await hold.wait()
            else:
                for _ in range(3):
                    await asyncio.sleep(0)
            self.running.discard(name)
            self.log.append(f"-{name}")
            return name

        return body


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def starts(log: list[str]) -> list[str]:
    return [entry[1:] for entry in log if entry.startswith("+")]


def test_serial_operations_run_one_at_a_time_and_concurrent_ones_beside_them():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        await asyncio.gather(*(gate.run(rec.op(f"s{i}"), "serial", caller=f"a{i}") for i in range(3)))
        assert rec.max_parallel == 1
        rec2 = Recorder()
        await asyncio.gather(
            gate.run(rec2.op("s"), "serial", caller="a"),
            *(gate.run(rec2.op(f"c{i}"), "concurrent", caller=f"c{i}") for i in range(3)),
        )
        assert rec2.max_parallel == 4

    run(main())


def test_calls_are_fifo_per_caller_and_round_robin_across_callers():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        first = asyncio.create_task(gate.run(rec.op("x", hold), "serial", caller="x"))
        await settle()
        tasks = [asyncio.create_task(gate.run(rec.op(f"a{i}"), "serial", caller="a")) for i in range(3)]
        await settle()
        tasks += [asyncio.create_task(gate.run(rec.op(f"b{i}"), "serial", caller="b")) for i in range(2)]
        await settle()
        hold.set()
        await asyncio.gather(first, *tasks)
        assert starts(rec.log) == ["x", "a0", "b0", "a1", "b1", "a2"]

    run(main())


def test_a_concurrent_call_passes_a_serial_call_waiting_for_the_slot():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        busy = asyncio.create_task(gate.run(rec.op("s1", hold), "serial", caller="a"))
        await settle()
        waiting = asyncio.create_task(gate.run(rec.op("s2"), "serial", caller="b"))
        passing = asyncio.create_task(gate.run(rec.op("c"), "concurrent", caller="c"))
        await passing
        assert starts(rec.log) == ["s1", "c"]
        hold.set()
        await asyncio.gather(busy, waiting)
        assert starts(rec.log) == ["s1", "c", "s2"]

    run(main())


def test_an_exclusive_operation_is_an_arrival_order_barrier():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        early = asyncio.create_task(gate.run(rec.op("c-early", hold), "concurrent", caller="a"))
        await settle()
        exclusive = asyncio.create_task(gate.run(rec.op("x"), "exclusive", caller="b"))
        await settle()
        late = asyncio.create_task(gate.run(rec.op("c-late"), "concurrent", caller="c"))
        await settle()
        # The exclusive op waits for what arrived before it; the later concurrent op waits for the exclusive one.
        assert starts(rec.log) == ["c-early"]
        hold.set()
        await asyncio.gather(early, exclusive, late)
        assert rec.log.index("-x") < rec.log.index("+c-late")
        assert rec.log.index("-c-early") < rec.log.index("+x")

    run(main())


def test_an_exclusive_operation_waits_for_earlier_calls_of_a_caller_queued_behind_others():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        tasks = [asyncio.create_task(gate.run(rec.op("a0", hold), "serial", caller="a"))]
        await settle()
        tasks.append(asyncio.create_task(gate.run(rec.op("a1"), "serial", caller="a")))
        await settle()
        tasks.append(asyncio.create_task(gate.run(rec.op("x"), "exclusive", caller="b")))
        await settle()
        hold.set()
        await asyncio.gather(*tasks)
        assert starts(rec.log) == ["a0", "a1", "x"]

    run(main())


def test_a_waiter_past_the_deadline_is_refused_unrun():
    async def main() -> None:
        gate, rec = Gate(queue_timeout_s=0.05, name="maze"), Recorder()
        hold = asyncio.Event()
        busy = asyncio.create_task(gate.run(rec.op("long", hold), "serial", caller="a"))
        await settle()
        with pytest.raises(EnvBusy) as caught:
            await gate.run(rec.op("late"), "serial", caller="b", what="tool call 'guess'")
        message = str(caught.value)
        assert message.startswith("tool call 'guess' not run: env busy (waited ")
        assert "the limit is 0.05 s" in message
        assert "late" not in starts(rec.log)
        assert gate.waiting == 0
        hold.set()
        await busy

    run(main())


@pytest.mark.parametrize("value", [0, -1, float("nan"), True, "240"])
def test_the_queue_timeout_is_positive_or_none(value):
    with pytest.raises(ValueError, match="queue_timeout_s must be a positive number"):
        Gate(queue_timeout_s=value)
    assert Gate(queue_timeout_s=None).queue_timeout_s is None


def test_cancelling_a_waiter_leaves_the_queue_and_the_callers_next_call_keeps_its_place():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        busy = asyncio.create_task(gate.run(rec.op("x", hold), "serial", caller="x"))
        await settle()
        gone = asyncio.create_task(gate.run(rec.op("a0"), "serial", caller="a"))
        await settle()
        nxt = asyncio.create_task(gate.run(rec.op("a1"), "serial", caller="a"))
        other = asyncio.create_task(gate.run(rec.op("b0"), "serial", caller="b"))
        await settle()
        gone.cancel()
        await settle()
        assert gate.waiting == 2
        hold.set()
        await asyncio.gather(busy, nxt, other)
        assert starts(rec.log) == ["x", "a1", "b0"]
        assert gone.cancelled()

    run(main())


def test_an_admitted_operation_runs_to_completion_when_its_caller_gives_up():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        call = asyncio.create_task(gate.run(rec.op("op", hold), "serial", caller="a"))
        await settle()
        call.cancel()
        await settle()
        assert call.cancelled()
        assert gate.in_flight == 1  # still holding its grant
        follower = asyncio.create_task(gate.run(rec.op("next"), "serial", caller="b"))
        await settle()
        assert starts(rec.log) == ["op"]
        hold.set()
        assert await follower == "next"
        assert rec.log == ["+op", "-op", "+next", "-next"]

    run(main())


def test_an_operation_that_never_waits_ends_within_its_call_and_gives_its_turn_back():
    async def main() -> None:
        gate = Gate(queue_timeout_s=5)  # a grant never given back fails the exclusive call below with EnvBusy

        async def answer() -> int:
            return 42

        async def broken() -> int:
            raise ValueError("the tool failed")

        assert await gate.run(answer, "serial", caller="a") == 42
        assert gate.in_flight == 0 and await gate.drain(0)
        with pytest.raises(ValueError, match="the tool failed"):
            await gate.run(broken, "concurrent", caller="a")
        assert gate.in_flight == 0
        # An exclusive turn needs nothing in flight: it is admitted, so both grants were given back.
        assert await gate.run(answer, "exclusive", caller="b") == 42

    run(main())


def test_closing_fails_waiters_and_later_calls_with_gate_closed():
    async def main() -> None:
        gate, rec = Gate(), Recorder()
        hold = asyncio.Event()
        busy = asyncio.create_task(gate.run(rec.op("op", hold), "serial", caller="a"))
        await settle()
        waiter = asyncio.create_task(gate.run(rec.op("w"), "serial", caller="b"))
        await settle()
        gate.close()
        gate.close()  # idempotent
        with pytest.raises(GateClosed):
            await waiter
        with pytest.raises(GateClosed):
            await gate.run(rec.op("later"), "concurrent")
        assert not await gate.drain(0.01)
        hold.set()
        assert await busy == "op"  # admitted work still ends normally
        assert await gate.drain(1)

    run(main())


def test_a_re_entrant_acquire_raises_instead_of_deadlocking():
    async def main() -> None:
        gate = Gate()

        async def outer() -> None:
            await gate.run(lambda: asyncio.sleep(0), "concurrent")

        with pytest.raises(RuntimeError, match="re-entrant"):
            await gate.run(outer, "serial")
        # Another gate is a different environment: no deadlock to prevent.
        other = Gate()

        async def nested() -> str:
            return await other.run(lambda: asyncio.sleep(0, "inner"))

        assert await gate.run(nested) == "inner"

    run(main())


def test_an_unknown_operation_class_is_refused():
    with pytest.raises(ValueError, match="operation class must be one of"):
        run(Gate().run(lambda: asyncio.sleep(0), "parallel"))


def test_errors_of_operations_reach_their_caller_and_release_the_grant():
    async def main() -> None:
        gate = Gate()

        async def boom() -> None:
            raise KeyError("x")

        with pytest.raises(KeyError):
            await gate.run(boom, "exclusive")
        assert gate.in_flight == 0
        assert await gate.run(lambda: asyncio.sleep(0, 7)) == 7

    run(main())
