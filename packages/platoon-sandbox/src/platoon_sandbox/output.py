"""Captured command output, the same for every provider: each stream keeps its first 8 MiB and
counts the rest, and after a command exits its pipes drain until they end, or until `DRAIN_S` pass with nothing
read (a background child still holding them is not waited for: `drain`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from platoon.sandbox import OUTPUT_CAP_BYTES

#: Seconds without output after which a pipe that has not ended is given up on, once the command exited.
DRAIN_S = 1.0


class CappedOutput:
    """One output stream: the first `OUTPUT_CAP_BYTES` kept, the rest counted. An object rather than a task's
    result, so that what was read survives the drain window closing on a pipe a background child holds."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.dropped = 0
        #: every byte read, kept or dropped: `drain` tells by it whether the pipe still gives output
        self.bytes_read = 0

    def add(self, chunk: bytes) -> None:
        self.bytes_read += len(chunk)
        room = max(0, OUTPUT_CAP_BYTES - len(self.kept))
        self.kept += chunk[:room]
        self.dropped += len(chunk) - min(room, len(chunk))

    async def read_from(self, reader: asyncio.StreamReader | None) -> None:
        if reader is None:
            return
        while chunk := await reader.read(65536):
            self.add(chunk)

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        return text + f"\n[{self.dropped} bytes of output dropped]\n" if self.dropped else text


async def drain(readers: Iterable[asyncio.Future[Any]], outputs: Iterable[CappedOutput]) -> None:
    """After a command exited: wait for its pipes' readers to end, giving up (and cancelling them) once `DRAIN_S`
    passed in which no output arrived, as when a background child holds a pipe open.

    A fixed window would be measured in wall time: an event loop held up for longer than it (a garbage
    collection of a large process, a starved CPU) would cancel readers before they read output already waiting in
    the pipe, and a command that printed its answer would seem to have printed nothing.
    """
    pending = set(readers)
    streams = list(outputs)
    while pending:
        before = sum(stream.bytes_read for stream in streams)
        _done, pending = await asyncio.wait(pending, timeout=DRAIN_S)
        if pending and sum(stream.bytes_read for stream in streams) == before:
            break
    for reader in pending:
        reader.cancel()
