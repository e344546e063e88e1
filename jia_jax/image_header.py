"""An encoded image's size from its header, without decoding it.

The GPU path's host half needs each image's (width, height) to draw its crop window. Pillow's
`Image.open` parses every marker of a JPEG's header into Python objects; the size sits in the
start-of-frame segment (ITU-T T.81, B.2.2), which a walk over the segments' lengths reaches in a
few steps. Anything that walk does not end at a start of frame (a PNG, an odd or damaged JPEG)
is left to Pillow, as before.
"""

from __future__ import annotations

import io

import PIL.Image

# Start-of-frame markers: 0xC0-0xCF but DHT (C4), JPG (C8) and DAC (CC).
_START_OF_FRAME = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# The restart markers RST0-7 have no length (T.81, B.1.1.3); Pillow skips them in a header too.
_RESTART = frozenset(range(0xD0, 0xD8))
_START_OF_SCAN = 0xDA


def jpeg_size(encoded: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) of a JPEG's first start-of-frame segment, or None where the bytes do not
    lead to one through well-formed segments before the first scan."""
    if bytes(encoded[:2]) != b"\xff\xd8":
        return None
    at, end = 2, len(encoded)
    while at + 4 <= end:
        if encoded[at] != 0xFF:
            return None
        marker = encoded[at + 1]
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        if marker in _RESTART:
            at += 2
            continue
        length = (encoded[at + 2] << 8) | encoded[at + 3]
        if marker in _START_OF_FRAME:
            if length < 8 or at + 9 > end:
                return None
            height = (encoded[at + 5] << 8) | encoded[at + 6]
            width = (encoded[at + 7] << 8) | encoded[at + 8]
            # Height 0 is defined by a later DNL segment: Pillow's to judge.
            return (width, height) if width and height else None
        if marker == _START_OF_SCAN or length < 2:
            return None
        at += 2 + length
    return None


def image_size(encoded: bytes | memoryview) -> tuple[int, int]:
    """(width, height) of an encoded image: a JPEG's from its start of frame, else Pillow's.

    Raises:
      PIL.UnidentifiedImageError: (or another error of Pillow's) the bytes hold no image header
        Pillow reads.
    """
    size = jpeg_size(encoded)
    if size is not None:
        return size
    with PIL.Image.open(io.BytesIO(encoded)) as image:  # reads the header only
        return image.size
