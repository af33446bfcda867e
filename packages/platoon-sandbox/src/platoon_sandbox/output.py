"""Captured command output, the same for every provider: each stream keeps its first 8 MiB and
counts the rest, and after a command exits its pipes get `DRAIN_S` to drain (a background child still holding them
is not waited for)."""

from __future__ import annotations

import asyncio

from platoon.sandbox import OUTPUT_CAP_BYTES

#: Seconds the output pipes get after the command exits.
DRAIN_S = 1.0


class CappedOutput:
    """One output stream: the first `OUTPUT_CAP_BYTES` kept, the rest counted. An object rather than a task's
    result, so that what was read survives the drain window closing on a pipe a background child holds."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
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
