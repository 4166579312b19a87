"""The protobuf wire format, read without generated code or schema files.

XLA's dumps are protobuf messages (``xla.HloProto``); jaxmem reads only the fields it needs
(named by number where they are used) and skips everything else by its length.
"""

from __future__ import annotations

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def fields(buf: bytes, pos: int, end: int, want: frozenset[int]) -> dict[int, list]:
    """The fields numbered in ``want`` of the message ``buf[pos:end]``, in wire order.

    A varint field gives an int (unsigned; see :func:`_signed`), a length-delimited one the
    ``(start, stop)`` span of its payload in ``buf``, a fixed64 / fixed32 one its raw little-endian
    value. Fields not in ``want`` are skipped without being decoded. The varint loops are inlined:
    this function carries the whole decode.
    """
    out: dict[int, list] = {}
    val: int | tuple[int, int]  # varint, fixed64/32: the value; length-delimited: the payload's span
    while pos < end:
        b = buf[pos]
        pos += 1
        if b < 0x80:
            key = b
        else:
            key = b & 0x7F
            shift = 7
            while True:
                b = buf[pos]
                pos += 1
                key |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
        wire = key & 7
        if wire == _VARINT:
            b = buf[pos]
            pos += 1
            if b < 0x80:
                val = b
            else:
                val = b & 0x7F
                shift = 7
                while True:
                    b = buf[pos]
                    pos += 1
                    val |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
        elif wire == _LEN:
            b = buf[pos]
            pos += 1
            if b < 0x80:
                n = b
            else:
                n = b & 0x7F
                shift = 7
                while True:
                    b = buf[pos]
                    pos += 1
                    n |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
            val = (pos, pos + n)
            pos += n
        elif wire == _FIXED64:
            val = int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == _FIXED32:
            val = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:  # groups (3, 4) are not used by any message read here
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")
        f = key >> 3
        if f in want:
            lst = out.get(f)
            if lst is None:
                out[f] = [val]
            else:
                lst.append(val)
    if pos != end:
        raise ValueError("truncated protobuf message")
    return out


def signed(v: int) -> int:
    """An int64 read as an unsigned varint, back to its sign (two's complement)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def packed(buf: bytes, vals: list | None) -> list[int]:
    """A repeated int64 field: packed spans and/or plain varints, in order, signed."""
    if not vals:
        return []
    out: list[int] = []
    for v in vals:
        if isinstance(v, int):
            out.append(signed(v))
            continue
        pos, end = v
        while pos < end:
            b = buf[pos]
            pos += 1
            x = b & 0x7F
            shift = 7
            while b >= 0x80:
                b = buf[pos]
                pos += 1
                x |= (b & 0x7F) << shift
                shift += 7
            out.append(signed(x))
    return out


def string(buf: bytes, vals: list | None) -> str:
    if not vals:
        return ""
    s, e = vals[-1]
    return buf[s:e].decode("utf-8", "replace")


def integer(vals: list | None, default: int = 0) -> int:
    return signed(vals[-1]) if vals else default


