"""A small pure-stdlib PNG reader for the tests: validates structure and CRCs and decodes
8-bit non-interlaced images (gray, RGB, RGBA) to raw pixel rows."""

import struct
import zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # color type -> samples per pixel


class Png:
    def __init__(self, width, height, bit_depth, color_type, rows):
        self.width = width
        self.height = height
        self.bit_depth = bit_depth
        self.color_type = color_type
        self.rows = rows  # list of `height` bytes objects, width * channels each

    @property
    def channels(self):
        return CHANNELS[self.color_type]

    def pixel(self, x, y):
        c = self.channels
        return tuple(self.rows[y][x * c:(x + 1) * c])


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(raw, width, height, bpp):
    stride = width * bpp
    assert len(raw) == height * (stride + 1), (
        f"IDAT holds {len(raw)} bytes, expected {height * (stride + 1)} for {width}x{height}")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        assert kind <= 4, f"row {y} has filter type {kind}"
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            upleft = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + _paeth(left, up, upleft)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return rows


def read_png(data):
    """Parses `data`; raises AssertionError naming the first problem found."""
    assert data[:8] == SIGNATURE, f"not a PNG (starts with {data[:8]!r})"
    pos, chunks = 8, []
    while pos < len(data):
        assert pos + 8 <= len(data), "truncated chunk header"
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert len(body) == length, f"truncated {kind!r} chunk"
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, f"bad CRC in {kind!r} chunk"
        chunks.append((kind, body))
        pos += 12 + length
        if kind == b"IEND":
            break
    assert chunks and chunks[0][0] == b"IHDR", "first chunk is not IHDR"
    assert chunks[-1][0] == b"IEND", "no IEND chunk"
    width, height, depth, color, compression, filt, interlace = struct.unpack(
        ">IIBBBBB", chunks[0][1])
    assert depth == 8, f"bit depth {depth}, expected 8"
    assert color in CHANNELS, f"color type {color} unsupported"
    assert (compression, filt, interlace) == (0, 0, 0), "unexpected compression/filter/interlace"
    idat = b"".join(body for kind, body in chunks if kind == b"IDAT")
    assert idat, "no IDAT chunk"
    raw = zlib.decompress(idat)
    rows = _unfilter(raw, width, height, CHANNELS[color])
    return Png(width, height, depth, color, rows)


def max_abs_diff(a, b):
    """Largest per-sample difference between two decoded PNGs of the same shape."""
    assert (a.width, a.height, a.channels) == (b.width, b.height, b.channels)
    return max(max(abs(x - y) for x, y in zip(ra, rb)) for ra, rb in zip(a.rows, b.rows))
