"""Tests for jia_jax/tile_ring.py: an array goes out again only after its last reader finished,
to one taker at a time, at most `depth` per shape; and a reused array, full of an earlier batch's
pixels, gives the GPU path the crops a fresh one gives (jia_jax/gpu_input.py `decode_rows`, with
the Pillow stand-in for nvImageCodec of tests/gpu_fakes.py)."""

import gc
import io
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from jia_jax import crop_resize, crop_windows, gpu_decode, gpu_input, record_batches, tile_ring
from tests.gpu_fakes import FakeNvImageCodec, FakeStream

_CANVAS = 32
_SIZE = 12
# The device resize against Pillow's, both rounded to uint8 (jia_jax/crop_resize.py).
_LEVELS = 4


class FakeReader:
    """A program's output: finished once `ready`; waiting for it finishes it."""

    def __init__(self, ready: bool = False) -> None:
        self.ready, self.waited = ready, False

    def is_deleted(self) -> bool:
        return False

    def is_ready(self) -> bool:
        return self.ready

    def block_until_ready(self) -> "FakeReader":
        self.waited = self.ready = True
        return self


class RecordingRing(tile_ring.TileRing):
    """A ring that records what is given back to it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.given: list[tuple[jax.Array, tile_ring.Reader | None]] = []

    def give(self, tiles, reader) -> None:
        self.given.append((tiles, reader))
        super().give(tiles, reader)


@pytest.fixture
def made(monkeypatch) -> list[jax.Array]:
    """Every array `gpu_decode.new_tiles` makes, in order."""
    arrays = []
    new_tiles = gpu_decode.new_tiles

    def counted(device, count, canvas):
        arrays.append(new_tiles(device, count, canvas))
        return arrays[-1]

    monkeypatch.setattr(gpu_decode, "new_tiles", counted)
    return arrays


def test_a_reused_array_waits_for_its_reader_and_a_finished_one_goes_first(made):
    ring = tile_ring.TileRing(jax.devices()[0], depth=2)
    a = ring.take(4, 8)
    assert a.shape == (4, 8, 8, 3) and a.dtype == jnp.uint8 and a.devices() == {jax.devices()[0]}
    reads_a = FakeReader()
    ring.give(a, reads_a)
    b = ring.take(4, 8)  # `a` is still being read: a second array
    assert b is not a and not reads_a.waited
    reads_b = FakeReader()
    ring.give(b, reads_b)
    assert ring.take(4, 8) is a and reads_a.waited  # two made: the oldest, once read
    ring.give(a, FakeReader(ready=True))
    assert ring.take(4, 8) is a and not reads_b.waited  # finished, so before `b`
    # Each shape has its own arrays.
    others = [ring.take(2, 8), ring.take(4, 16)]
    assert [o.shape for o in others] == [(2, 8, 8, 3), (4, 16, 16, 3)]
    assert len(made) == 4 and all(m is x for m, x in zip(made, [a, b, *others]))


def test_random_takes_and_gives_never_hand_out_an_array_being_read_or_held(made):
    """Any order of takes and gives (readers finishing at random): a taken array's last reader
    has finished and no other taker holds it; no shape gets more than `depth` arrays."""
    depth, rng = 3, np.random.default_rng(0)
    ring = tile_ring.TileRing(jax.devices()[0], depth)
    held: list[jax.Array] = []
    readers: dict[int, list[FakeReader]] = {}
    for _ in range(200):
        shape = (2, 8) if rng.random() < 0.7 else (1, 8)
        if held and (rng.random() < 0.5 or sum(h.shape[0] == shape[0] for h in held) == depth):
            tiles = held.pop(int(rng.integers(len(held))))
            reader = FakeReader(ready=rng.random() < 0.5)
            readers.setdefault(id(tiles), []).append(reader)
            ring.give(tiles, reader)
            for r in rng.choice(sum(readers.values(), []), 2):  # programs finish meanwhile
                r.ready = True
            continue
        tiles = ring.take(*shape)
        assert all(tiles is not h for h in held)
        assert all(r.ready for r in readers.get(id(tiles), []))
        held.append(tiles)
    counts = [sum(m.shape[0] == count for m in made) for count in (1, 2)]
    assert counts == [depth, depth]


def test_a_taker_waits_while_every_array_is_out():
    """Two threads (the train and eval streams) on one ring of depth 1: the second take returns
    the first's array once it is given back and its reader has finished."""
    ring = tile_ring.TileRing(jax.devices()[0], depth=1)
    first = ring.take(2, 8)
    taken = []
    waiter = threading.Thread(target=lambda: taken.append(ring.take(2, 8)))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not taken
    reader = FakeReader()
    ring.give(first, reader)
    waiter.join(timeout=10)
    assert len(taken) == 1 and taken[0] is first and reader.waited


def test_a_deleted_reader_is_an_error_not_a_guess():
    """A donated or deleted reader may still be running: the ring cannot tell, so it raises."""
    ring = tile_ring.TileRing(jax.devices()[0], depth=1)
    reader = jnp.ones(3)
    reader.delete()
    ring.give(ring.take(2, 8), reader)
    with pytest.raises(RuntimeError, match="reader was deleted or donated"):
        ring.take(2, 8)


def _jpeg(pixels: np.ndarray) -> np.ndarray:
    encoded = io.BytesIO()
    PIL.Image.fromarray(pixels).save(encoded, format="JPEG", quality=90)
    return np.frombuffer(encoded.getvalue(), np.uint8)


def _decoded(data: np.ndarray) -> np.ndarray:
    """Pillow's pixels of JPEG `data` (the stand-in decoder's)."""
    return np.asarray(PIL.Image.open(io.BytesIO(data.tobytes())).convert("RGB"))


def _record_batch(sizes: list[tuple[int, int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A record batch of smooth JPEGs of (width, height) `sizes` (an empty one for (0, 0): no
    image) with train windows, as jia_jax/record_batches.py makes them."""
    encoded, boxes, flips = [], [], []
    for width, height in sizes:
        if width:
            coarse = PIL.Image.fromarray(rng.integers(0, 256, (3, 4, 3), dtype=np.uint8))
            image = np.asarray(coarse.resize((width, height), PIL.Image.BICUBIC))
            encoded.append(_jpeg(image))
            box, flip = crop_windows.train_window(rng, width, height)
        else:
            encoded.append(np.zeros(0, np.uint8))
            box, flip = (0.0, 0.0, 1.0, 1.0), False
        boxes.append(box)
        flips.append(flip)
    return {
        record_batches.ENCODED: np.concatenate(encoded),
        record_batches.OFFSETS: np.cumsum([0] + [len(e) for e in encoded]),
        record_batches.SIZE: np.array(sizes, np.int32),
        record_batches.BOX: np.array(boxes, np.float64),
        record_batches.FLIP: np.array(flips),
    }


def _pillow(batch: dict[str, np.ndarray]) -> np.ndarray:
    """The CPU path's crops of `batch`: Pillow's bilinear resize of each window, flipped."""
    offsets, out = batch[record_batches.OFFSETS], []
    for i, (box, flip) in enumerate(zip(batch[record_batches.BOX], batch[record_batches.FLIP])):
        data = batch[record_batches.ENCODED][offsets[i] : offsets[i + 1]]
        if not len(data):
            out.append(np.zeros((_SIZE, _SIZE, 3), np.uint8))
            continue
        image = PIL.Image.fromarray(_decoded(data))
        pixels = np.asarray(image.resize((_SIZE, _SIZE), PIL.Image.BILINEAR, box=tuple(box)))
        out.append(pixels[:, ::-1] if flip else pixels)
    return np.stack(out)


def test_a_reused_array_full_of_an_earlier_batchs_pixels_gives_a_fresh_ones_crops():
    """The slots first hold bright noise over the whole canvas (an earlier batch of images as
    large as a tile); then a batch of smaller images, one larger than a tile (its edge tiles
    are partial) and an example without an image (a padding tile), is decoded into the same
    array. Its crops are a fresh array's bit for bit, and Pillow's within the resize's rounding:
    the crop reads no pixel outside the regions the decoder wrote."""
    rng = np.random.default_rng(0)
    sizes = [(20, 27), (32, 17), (9, 30), (70, 45), (0, 0), (31, 31), (25, 12), (16, 16), (5, 8)]
    batch = _record_batch(sizes, rng)
    rows = slice(0, len(sizes))
    device = jax.devices()[0]
    decoder = gpu_decode.NvImageCodecDecoder(device, FakeNvImageCodec(), FakeStream())
    plan = crop_resize.plan_tiles(
        batch[record_batches.BOX],
        batch[record_batches.SIZE],
        batch[record_batches.FLIP],
        np.diff(batch[record_batches.OFFSETS]) > 0,
        _SIZE,
        _CANVAS,
    )
    count = crop_resize.padded_count(len(plan.example), len(sizes))
    assert count > len(plan.example)  # a padding tile too

    ring = RecordingRing(device, depth=1)
    dirty = ring.take(count, _CANVAS)
    noise = _jpeg(rng.integers(128, 256, (_CANVAS, _CANVAS, 3), dtype=np.uint8))
    whole = np.array([[0, 0, _CANVAS, _CANVAS]] * count)
    assert decoder([noise] * count, whole, dirty).all()
    ring.give(dirty, None)

    reused, failed = gpu_input.decode_rows(
        batch, rows, gpu_input.DeviceDecoder(device, decoder, ring), _SIZE, _CANVAS
    )
    fresh_ring = tile_ring.TileRing(device)
    fresh, _ = gpu_input.decode_rows(
        batch, rows, gpu_input.DeviceDecoder(device, decoder, fresh_ring), _SIZE, _CANVAS
    )
    assert failed == []
    # Given back with an output of the crop that read it, for the ring to wait for: one pixel of
    # its own, so that the ring does not keep the batch's images alive.
    reader = ring.given[-1][1]
    assert ring.given[-1][0] is dirty and reader.shape == (1, 1, 1, 1)
    np.testing.assert_array_equal(reader, np.asarray(reused)[:1, :1, :1, :1])
    np.testing.assert_array_equal(reused, fresh)
    expected = _pillow(batch)
    assert np.abs(np.asarray(reused, np.int32) - expected).max() <= _LEVELS

    # The batch went into `dirty`, whose slots kept the noise outside the batch's regions.
    assert ring.take(count, _CANVAS) is dirty
    slots, noise, offsets = np.asarray(dirty), _decoded(noise), batch[record_batches.OFFSETS]
    padded = crop_resize.pad_plan(plan, count, len(sizes))
    stale = 0
    for slot, e, (top, left, bottom, right) in zip(slots, padded.example, padded.region):
        inside = np.zeros((_CANVAS, _CANVAS), bool)
        inside[: bottom - top, : right - left] = True
        np.testing.assert_array_equal(slot[~inside], noise[~inside])
        stale += np.count_nonzero(~inside)
        if e < len(sizes):
            image = _decoded(batch[record_batches.ENCODED][offsets[e] : offsets[e + 1]])
            region = image[top:bottom, left:right]
            np.testing.assert_array_equal(slot[: bottom - top, : right - left], region)
    assert stale > count * _CANVAS**2 / 2


def test_batch_after_batch_the_gpu_path_makes_no_new_array(made):
    """Once the ring holds its arrays, `decode_rows` makes none: no batch waits for new zeros
    behind the train steps XLA has queued."""
    rng = np.random.default_rng(1)
    batch = _record_batch([(20, 27), (32, 17), (9, 30), (31, 31)], rng)
    device = jax.devices()[0]
    decoder = gpu_decode.NvImageCodecDecoder(device, FakeNvImageCodec(), FakeStream())
    made.clear()  # the decoder's start-up probes
    ring = tile_ring.TileRing(device)
    outputs = [
        gpu_input.decode_rows(
            batch, slice(0, 4), gpu_input.DeviceDecoder(device, decoder, ring), _SIZE, _CANVAS
        )[0]
        for _ in range(3 * tile_ring.DEPTH)
    ]
    assert 1 <= len(made) <= tile_ring.DEPTH
    for out in outputs:
        np.testing.assert_array_equal(out, outputs[0])


def test_the_ring_does_not_keep_a_batchs_images_alive():
    """A batch's images are freed once the batch lets them go, not when the ring hands their tile
    array out again several batches later: memory held on so long shifts where XLA's pool places
    the next train steps' temporary buffers (docs/input_pipeline.md)."""
    rng = np.random.default_rng(2)
    batch = _record_batch([(20, 27), (32, 17), (9, 30), (31, 31)], rng)
    device = jax.devices()[0]
    decoder = gpu_decode.NvImageCodecDecoder(device, FakeNvImageCodec(), FakeStream())
    ring = tile_ring.TileRing(device)
    images, _ = gpu_input.decode_rows(
        batch, slice(0, 4), gpu_input.DeviceDecoder(device, decoder, ring), _SIZE, _CANVAS
    )
    freed = weakref.ref(images)
    images.block_until_ready()
    del images
    gc.collect()
    assert freed() is None
