"""TensorBoard event files, written with no dependency.

An event file is a TFRecord file of ``Event`` protocol buffers (TensorFlow's
``event.proto``, which TensorBoard and tensorboardX read and write):

- each record is ``length`` (uint64, little-endian), the masked CRC-32C of
  those 8 bytes (uint32), the data, and the masked CRC-32C of the data;
  a masked CRC is ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` mod 2**32;
- the first event holds only ``wall_time`` and ``file_version``
  ("brain.Event:2");
- each later event holds ``wall_time`` (field 1, double), ``step`` (field 2,
  varint) and a ``Summary`` (field 5) whose ``Value``s (field 1) each carry a
  ``tag`` (field 1, string) and a ``simple_value`` (field 2, float).

That is all of the format a scalar series needs, so monsoon writes it itself:
importing tensorboardX would import torch (two seconds) in every run.
TensorBoard's own ``EventAccumulator`` reads these files in the tests.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

FILE_VERSION = b"brain.Event:2"


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1   # Castagnoli, reflected
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def scalar_event(values: dict, step: int, wall_time: float) -> bytes:
    """One ``Event`` holding a ``Summary`` of ``tag: simple_value`` pairs."""
    summary = b"".join(
        _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", float(value)))
        for tag, value in values.items())
    return (b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(max(0, int(step)))
            + _field(5, summary))


def record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc(length)) + data
            + struct.pack("<I", masked_crc(data)))


# The end of monsoon's own event files' names: a new run in a used folder
# clears its earlier runs' (``run_folder.clear_results``) and never the files
# a user's own writer put in tb/ (torch's SummaryWriter names its
# ``events.out.tfevents.TIME.HOST.PID.N``, TensorFlow's ``...v2``).
OWN_SUFFIX = ".monsoon"
OWN_PATTERN = "events.out.tfevents.*" + OWN_SUFFIX


def is_own(name: str) -> bool:
    """Whether ``name`` is that of an event file monsoon writes."""
    return name.startswith("events.out.tfevents.") and name.endswith(OWN_SUFFIX)


class EventFile:
    """An event file in ``directory``, named as TensorBoard looks for it
    (``events.out.tfevents.TIME.HOST.PID.monsoon``: TensorBoard reads any
    name holding "tfevents"), each event flushed as written. ``path``: one
    begun before (by another process of the run), carried on: appended to,
    its first event not written again."""

    def __init__(self, directory, wall_time: float | None = None, path=None):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time() if wall_time is None else wall_time
        if path is None:
            path = directory / (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}."
                                f"{os.getpid()}{OWN_SUFFIX}")
        self.path = Path(path)
        self._file = open(self.path, "ab")  # appends: every write lands at the file's end
        if self._file.tell() == 0:
            self._write(b"\x09" + struct.pack("<d", now) + _field(3, FILE_VERSION))

    def _write(self, event: bytes) -> None:
        self._file.write(record(event))
        self._file.flush()

    def scalars(self, values: dict, step: int, wall_time: float) -> None:
        if values:
            self._write(scalar_event(values, step, wall_time))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
