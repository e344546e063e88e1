"""Tests for jia_jax.image_header: sizes read from JPEG headers against Pillow's."""

import io
import struct

import numpy as np
import PIL.Image
import pytest

from jia_jax import image_header


def _image(width, height, mode="RGB"):
    rng = np.random.default_rng(width * 1000 + height)
    image = PIL.Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8))
    return image if mode == "RGB" else image.convert(mode)


def _jpeg(image, **options):
    encoded = io.BytesIO()
    image.save(encoded, format="JPEG", **options)
    return encoded.getvalue()


def _segments(jpeg):
    """The JPEG's header as [(marker, segment bytes)] up to its first scan, and the rest."""
    at, segments = 2, []
    while jpeg[at + 1] != 0xDA:
        (length,) = struct.unpack_from(">H", jpeg, at + 2)
        segments.append((jpeg[at + 1], jpeg[at : at + 2 + length]))
        at += 2 + length
    return segments, jpeg[at:]


def _reordered(jpeg, first):
    """`jpeg` with its segments of marker `first` moved to just after the start of image."""
    segments, rest = _segments(jpeg)
    moved = [s for m, s in segments if m == first] + [s for m, s in segments if m != first]
    return b"\xff\xd8" + b"".join(moved) + rest


def _pillow_size(encoded):
    with PIL.Image.open(io.BytesIO(encoded)) as image:
        return image.size


_EXIF = PIL.Image.Exif()
_EXIF[0x0112] = 6  # orientation: rotated; the stored size is what Pillow and the crop use


@pytest.mark.parametrize(
    "encoded",
    [
        _jpeg(_image(500, 375)),
        _jpeg(_image(375, 500), subsampling=0, quality=95),
        _jpeg(_image(33, 17), progressive=True),
        _jpeg(_image(40, 30, "L")),
        _jpeg(_image(41, 29, "CMYK")),
        _jpeg(_image(64, 48), optimize=True, exif=_EXIF.tobytes(), comment=b"a comment"),
        _jpeg(_image(64, 48), icc_profile=b"\x00" * 70000),  # ICC split over two APP2 segments
        _jpeg(_image(48, 40), restart_marker_blocks=1),
        _jpeg(_image(1, 65500, "L")),  # the largest side libjpeg writes
    ],
    ids=["420", "444", "progressive", "grey", "cmyk", "exif", "icc", "restarts", "tall"],
)
def test_jpeg_size_is_pillows(encoded):
    assert image_header.jpeg_size(encoded) == _pillow_size(encoded)
    assert image_header.image_size(np.frombuffer(encoded, np.uint8).data) == _pillow_size(encoded)


def test_a_huffman_table_before_the_frame_is_skipped_not_read_as_one():
    # DHT (0xC4) sits among the start-of-frame codes; libjpeg writes it after the frame, other
    # encoders before. Read as a frame, its bytes would give a wrong size.
    encoded = _reordered(_jpeg(_image(70, 50)), first=0xC4)
    assert _segments(encoded)[0][0][0] == 0xC4
    assert image_header.jpeg_size(encoded) == _pillow_size(encoded) == (70, 50)


def test_fill_bytes_and_restart_markers_in_the_header_are_skipped():
    segments, rest = _segments(_jpeg(_image(30, 20)))
    # Each segment after fill bytes (0xFF), a restart marker (0xFFD0, no length) first.
    encoded = b"\xff\xd8\xff\xd0" + b"".join(b"\xff\xff" + s for _, s in segments) + rest
    assert image_header.jpeg_size(encoded) == _pillow_size(encoded) == (30, 20)


def test_what_is_not_a_well_formed_jpeg_header_is_left_to_pillow():
    jpeg = _jpeg(_image(30, 20))
    png = io.BytesIO()
    _image(30, 20).save(png, format="PNG")
    (frame,) = [s for m, s in _segments(jpeg)[0] if m == 0xC0]
    no_height = jpeg.replace(frame, frame[:5] + b"\x00\x00" + frame[7:])
    for encoded in (png.getvalue(), jpeg[:20], b"\xff\xd8\x00\x00" + jpeg[4:], no_height):
        assert image_header.jpeg_size(encoded) is None
    assert image_header.image_size(png.getvalue()) == (30, 20)


def test_bytes_pillow_cannot_read_raise():
    jpeg = _jpeg(_image(30, 20))
    for encoded in (jpeg[:20], b"", b"not an image"):
        with pytest.raises(Exception):  # noqa: B017  Pillow's own error, whichever it is
            image_header.image_size(encoded)
