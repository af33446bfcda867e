"""After a command exits, its output pipes drain to their end however long the event loop is held up meanwhile (a
garbage collection of a large process, a starved CPU); only a pipe that stays silent for `DRAIN_S` while a
background child holds it open is given up on."""

from __future__ import annotations

import asyncio
import os
import time

from platoon_sandbox.output import DRAIN_S, CappedOutput, drain


async def _reading(read_fd: int, output: CappedOutput) -> asyncio.Task[None]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
    return asyncio.ensure_future(output.read_from(reader))


def test_output_waiting_in_the_pipe_is_read_even_when_the_loop_was_held_up_past_the_window():
    async def main() -> str:
        output = CappedOutput()
        chunks = [f"line {i}\n".encode() * 2000 for i in range(4)]  # more than one read, and a pipe buffer
        read_fd, write_fd = os.pipe()
        reader = await _reading(read_fd, output)
        loop = asyncio.get_running_loop()

        def writer() -> None:
            for chunk in chunks:
                os.write(write_fd, chunk)
                time.sleep(DRAIN_S * 0.6)  # the loop is held up: more than a window passes in all
            os.close(write_fd)

        writing = loop.run_in_executor(None, writer)
        loop.call_soon(time.sleep, DRAIN_S * 1.5)  # and the loop itself stalls once, longer than a window
        await drain([reader], [output])
        await writing
        assert reader.done() and not reader.cancelled()
        return output.text()

    text = asyncio.run(main())
    assert text == "".join(f"line {i}\n" * 2000 for i in range(4))


def test_a_pipe_a_background_child_keeps_open_is_given_up_after_a_silent_window():
    async def main() -> tuple[str, bool]:
        output = CappedOutput()
        read_fd, write_fd = os.pipe()
        reader = await _reading(read_fd, output)
        os.write(write_fd, b"the command's answer\n")  # then nothing, and the pipe stays open
        await drain([reader], [output])  # returns: the silent pipe is not waited for
        await asyncio.sleep(0)
        os.close(write_fd)
        return output.text(), reader.cancelled()

    text, cancelled = asyncio.run(main())
    assert text == "the command's answer\n" and cancelled
