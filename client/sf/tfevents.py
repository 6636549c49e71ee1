"""Owns reading TensorBoard event files (`events.out.tfevents.*`, as `SummaryWriter` of
PyTorch or tensorboardX and TensorFlow write them) into scalars, for the runner that ships them.

Two layers:

- the framing, always ours: TFRecord records (a little-endian u64 length, the masked CRC-32C
  of those 8 bytes, the data, the masked CRC-32C of the data), both checksums verified, a
  record over `MAX_RECORD` bytes stepped over without reading it, a file read from an offset
  so that a growing file is followed and a half-written record waits for the next read. The
  files are the job's, so hostile: a bad header checksum means the framing is lost (nothing
  after it can be trusted; the file is given up), a bad data checksum skips one record, a
  length of 2**60 is never allocated;
- the record (an `Event` protocol buffer): decoded by TensorBoard's own `event_pb2` where the
  runner's Python can import it (`maintained_decoder`), else by the few protobuf fields a
  scalar needs, decoded here (`scalars_in`): `Event.wall_time` (1), `step` (2), `summary` (5)
  → `Summary.value` (1) → `tag` (1), `simple_value` (2), `tensor` (8, a TF2-style scalar when
  `metadata` (9) names the scalars plugin or the scalar data class) → `TensorProto.dtype` (1),
  `tensor_content` (4), `float_val` (5), `double_val` (6). Nesting is fixed by the walk, so a
  deeply nested record costs nothing; a malformed one yields no scalar.

Standard library only, like the rest of the runner (TensorBoard's decoder is optional).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

MAX_RECORD = 1 << 20  # bytes: a scalar's event is ~100; images and graphs are not read
HEADER = 12  # u64 length, u32 masked crc of it
FOOTER = 4  # u32 masked crc of the data
SCALARS_PLUGIN = "scalars"
DATA_CLASS_SCALAR = 1  # tensorboard's SummaryMetadata.DataClass
DT_FLOAT, DT_DOUBLE = 1, 2


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames use it."""
    crc, table = 0xFFFFFFFF, _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    wall_time: float
    value: float


@dataclass(frozen=True)
class Read:
    """What the next read at an offset found: a record's data ("record"), or why there is none
    ("incomplete": wait for the writer; "oversized", "bad_crc": this record is skipped;
    "corrupt": the framing is lost), and the offset to go on from."""

    what: str
    data: bytes
    next_offset: int


def next_record(fh: IO[bytes], offset: int, size: int) -> Read:
    """The record at `offset` of a file of `size` bytes."""
    if size - offset < HEADER:
        return Read("incomplete", b"", offset)
    fh.seek(offset)
    header = fh.read(HEADER)
    if len(header) < HEADER:
        return Read("incomplete", b"", offset)
    (length,) = struct.unpack("<Q", header[:8])
    if masked_crc(header[:8]) != struct.unpack("<I", header[8:])[0]:
        return Read("corrupt", b"", offset)
    end = offset + HEADER + length + FOOTER
    if length > MAX_RECORD:
        return Read("oversized", b"", end)
    if end > size:
        return Read("incomplete", b"", offset)
    data = fh.read(length)
    footer = fh.read(FOOTER)
    if len(data) < length or len(footer) < FOOTER:
        return Read("incomplete", b"", offset)
    if masked_crc(data) != struct.unpack("<I", footer)[0]:
        return Read("bad_crc", b"", end)
    return Read("record", data, end)


# -- the protobuf fields a scalar needs -----------------------------------------------------------
class Malformed(Exception):
    """Bytes that are not the protocol buffer they should be."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 70:
        if pos >= len(buf):
            raise Malformed("a varint runs past the end")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise Malformed("a varint of more than 10 bytes")


_FIXED = {1: 8, 5: 4}


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one message, without descending:
    a varint as an int, anything else as its bytes."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in _FIXED or wire == 2:
            size = _FIXED[wire] if wire in _FIXED else 0
            if wire == 2:
                size, pos = _varint(buf, pos)
            if pos + size > end:
                raise Malformed("a field runs past the end")
            value, pos = buf[pos : pos + size], pos + size
        else:
            raise Malformed(f"wire type {wire} (groups) is not used by events")
        yield number, wire, value


def scalars_in(record: bytes) -> list[Scalar]:
    """The scalars of one event record (our own decoding); none when it holds none or is not
    an event."""
    try:
        wall_time, step, values = 0.0, 0, []
        for number, wire, value in fields(record):
            if number == 1 and wire == 1:
                (wall_time,) = struct.unpack("<d", value)
            elif number == 2 and wire == 0:
                step = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 5 and wire == 2:
                values += [v for n, w, v in fields(value) if n == 1 and w == 2]
        found = (_value(raw) for raw in values)
        return [Scalar(tag, step, wall_time, number) for tag, number in found if tag]
    except (Malformed, struct.error, UnicodeDecodeError):
        return []


def _value(raw: bytes) -> tuple[str, float]:
    """A Summary.Value's tag and scalar ("" when it holds no scalar)."""
    tag, simple, tensor, is_scalar = "", None, None, False
    for number, wire, value in fields(raw):
        if number == 1 and wire == 2:
            tag = value.decode("utf-8")
        elif number == 2 and wire == 5:
            (simple,) = struct.unpack("<f", value)
        elif number == 8 and wire == 2:
            tensor = value
        elif number == 9 and wire == 2:
            is_scalar = _names_a_scalar(value)
    if simple is not None:
        return tag, simple
    found = _tensor_scalar(tensor) if tensor is not None and is_scalar else None
    return (tag, found) if found is not None else ("", 0.0)


def _names_a_scalar(metadata: bytes) -> bool:
    for number, wire, value in fields(metadata):
        if number == 1 and wire == 2:  # plugin_data
            for n, w, v in fields(value):
                if n == 1 and w == 2 and v == SCALARS_PLUGIN.encode():
                    return True
        elif number == 4 and wire == 0 and value == DATA_CLASS_SCALAR:
            return True
    return False


def _tensor_scalar(tensor: bytes) -> float | None:
    """The one value of a float or double tensor, else None."""
    dtype, found = 0, []
    for number, wire, value in fields(tensor):
        if number == 1 and wire == 0:
            dtype = value
        elif number == 4 and wire == 2:
            found.append(value)
        elif number == 5 and wire in (2, 5):
            found += [struct.pack("<f", v) for v in _packed(value, "<f", 4)]
        elif number == 6 and wire in (2, 1):
            found += [struct.pack("<d", v) for v in _packed(value, "<d", 8)]
    width = {DT_FLOAT: 4, DT_DOUBLE: 8}.get(dtype)
    if width is None or len(found) != 1 or len(found[0]) != width:
        return None
    return float(struct.unpack("<f" if width == 4 else "<d", found[0])[0])


def _packed(value: bytes, fmt: str, width: int) -> list[float]:
    if len(value) % width:
        raise Malformed("a packed field of a partial value")
    return [struct.unpack(fmt, value[i : i + width])[0] for i in range(0, len(value), width)]


# -- TensorBoard's own decoder, where it can be imported ------------------------------------------
def maintained_decoder() -> Callable[[bytes], list[Scalar]] | None:
    """`scalars_in` by TensorBoard's `Event` protocol buffer, where the runner's Python has
    TensorBoard (and its protobuf); None where it does not or it will not import."""
    try:
        from tensorboard.compat.proto import event_pb2  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - any broken install means: use our own
        return None

    def decode(record: bytes) -> list[Scalar]:
        try:
            event = event_pb2.Event.FromString(record)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError, or its recursion limit
            return []
        found = []
        for value in event.summary.value:
            number = _maintained_value(value)
            if number is not None and value.tag:
                found.append(Scalar(value.tag, event.step, event.wall_time, number))
        return found

    return decode


def _maintained_value(value: Any) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    metadata = value.metadata
    is_scalar = (
        metadata.plugin_data.plugin_name == SCALARS_PLUGIN
        or metadata.data_class == DATA_CLASS_SCALAR
    )
    if not (is_scalar and value.HasField("tensor")):
        return None
    tensor = value.tensor
    items = [*tensor.float_val] if tensor.dtype == DT_FLOAT else [*tensor.double_val]
    if tensor.tensor_content:
        width = {DT_FLOAT: 4, DT_DOUBLE: 8}.get(tensor.dtype, 0)
        if len(tensor.tensor_content) != width:
            return None
        items.append(struct.unpack("<f" if width == 4 else "<d", tensor.tensor_content)[0])
    if tensor.dtype not in (DT_FLOAT, DT_DOUBLE) or len(items) != 1:
        return None
    return float(items[0])
