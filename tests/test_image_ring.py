"""Tests for jia_jax/image_ring.py and its use in jia_jax/gpu_input.py: an image array goes out
again only once the batch built from it is gone; a crop given one writes into its memory and
gives the crops new memory gets; through the trainer's streams, batch after batch, no image
array is taken from the ring while its batch is held."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jia_jax import gpu_decode, gpu_input, image_ring, tile_ring
from jia_jax import mesh as mesh_lib
from tests import test_gpu_input as gpu_tests
from tests import test_tile_ring as ring_tests
from tests.gpu_fakes import FakeNvImageCodec, FakeStream, fake_gpu  # noqa: F401  fixture
from tests.test_gpu_input import data_dir, mesh  # noqa: F401  fixtures


class Owner:
    """Stands in for a global batch: any object a weak reference can follow."""


def test_an_array_goes_out_once_its_owner_is_gone_and_to_one_taker():
    ring = image_ring.ImageRing(depth=2)
    array, owner = jnp.zeros((2, 4, 4, 3), jnp.uint8), Owner()
    ring.give(array, owner)
    assert ring.take(array.shape) is None  # its batch still held
    del owner
    gc.collect()
    assert ring.take((3, 4, 4, 3)) is None  # another shape
    assert ring.take(array.shape) is array
    assert ring.take(array.shape) is None  # no longer the ring's
    assert ring.held() == {}


def test_the_ring_keeps_at_most_depth_arrays_a_shape():
    ring = image_ring.ImageRing(depth=2)
    owners = [Owner() for _ in range(3)]
    arrays = [jnp.full((1, 2, 2, 3), i, jnp.uint8) for i in range(3)]
    for array, owner in zip(arrays, owners):
        ring.give(array, owner)
    ring.give(jnp.zeros((2, 2, 2, 3), jnp.uint8), owners[0])
    assert ring.held() == {(1, 2, 2, 3): 2, (2, 2, 2, 3): 1}
    del owners
    gc.collect()
    # The oldest first; the third was never kept.
    assert [ring.take((1, 2, 2, 3)) for _ in range(3)] == [arrays[0], arrays[1], None]


def _decoder(device, images=None):
    decoder = gpu_decode.NvImageCodecDecoder(device, FakeNvImageCodec(), FakeStream())
    return gpu_input.DeviceDecoder(device, decoder, tile_ring.TileRing(device), images)


def _equal(a: jax.Array, b: jax.Array) -> bool:
    """Compared on the device: on CPU, reading an array into numpy leaves a view of its memory
    behind, and XLA then copies rather than donates it."""
    return bool(jnp.array_equal(a, b))


def test_a_crop_given_an_earlier_batchs_images_writes_into_their_memory():
    """The second batch's crops land in the first batch's array once its owner is gone (the
    same buffer; the first array deleted: donated), and are the crops new memory gives, bit for
    bit: nothing of the first batch's pixels shows through. While the owner is held, the crop
    takes new memory and the first batch's pixels stay readable."""
    rng = np.random.default_rng(0)
    first = ring_tests._record_batch([(20, 27), (32, 17), (9, 30), (31, 31)], rng)
    second = ring_tests._record_batch([(25, 12), (16, 16), (5, 8), (70, 45)], rng)
    size, canvas = ring_tests._SIZE, ring_tests._CANVAS
    device, ring = jax.devices()[0], image_ring.ImageRing()
    decoder = _decoder(device, ring)
    rows = slice(0, 4)
    old, failed = gpu_input.decode_rows(first, rows, decoder, size, canvas)
    assert failed == []
    old_pixels, pointer, owner = jnp.copy(old), old.unsafe_buffer_pointer(), Owner()
    ring.give(old, owner)

    held, _ = gpu_input.decode_rows(second, rows, decoder, size, canvas)
    assert held.unsafe_buffer_pointer() != pointer and not old.is_deleted()
    assert _equal(old, old_pixels)

    del owner
    gc.collect()
    reused, _ = gpu_input.decode_rows(second, rows, decoder, size, canvas)
    assert old.is_deleted() and reused.unsafe_buffer_pointer() == pointer
    fresh, _ = gpu_input.decode_rows(second, rows, _decoder(device), size, canvas)
    np.testing.assert_array_equal(reused, fresh)
    np.testing.assert_array_equal(held, fresh)
    assert np.abs(np.asarray(fresh, np.int32) - ring_tests._pillow(second)).max() <= (
        ring_tests._LEVELS
    )


def test_batch_after_batch_the_streams_reuse_images_only_of_batches_let_go(
    data_dir, mesh, fake_gpu  # noqa: F811
):
    """The trainer's train stream on the 8 devices: while a batch is held, none of its images is
    donated (still readable, the same pixels); let go, its arrays serve later batches (deleted:
    donated), and the batches are those of a stream without the ring."""
    data = gpu_tests._data(data_dir)
    streams = {
        depth: gpu_input.GpuStreams.create(
            gpu_tests._with(data, decode="gpu", gpu_image_ring_depth=depth),
            mesh_lib.batch_sharding(mesh), gpu_tests._BATCH, gpu_tests._BATCH, 0,
        )
        for depth in (0, image_ring.DEPTH)
    }
    plain, kept = (iter(streams[d].train(0)) for d in (0, image_ring.DEPTH))
    held = next(kept)
    assert _equal(held["image"], next(plain)["image"])
    held_pixels = jnp.copy(held["image"])
    shards = [s.data for s in held["image"].addressable_shards]
    let_go = []
    for _ in range(3 * image_ring.DEPTH):
        batch, expected = next(kept), next(plain)
        assert _equal(batch["image"], expected["image"])
        let_go.append([s.data for s in batch["image"].addressable_shards])
        del batch
    assert _equal(held["image"], held_pixels)
    assert not any(s.is_deleted() for s in shards)
    assert all(s.is_deleted() for s in let_go[0])  # donated to a later batch's crops
    rings = {d.images for decoders in streams[image_ring.DEPTH].decoders
             for d in decoders.values()}
    assert len(rings) == len(mesh.devices.flat)
    assert all(max(r.held().values()) <= image_ring.DEPTH for r in rings)
    assert all(d.images is None for d in streams[0].decoders[0].values())


def test_image_ring_depth_must_not_be_negative(data_dir, mesh, fake_gpu):  # noqa: F811
    with pytest.raises(ValueError, match=r"data\.gpu_image_ring_depth=-1 must be 0 \(off\)"):
        gpu_tests._input(gpu_tests._data(data_dir), mesh, "gpu", gpu_image_ring_depth=-1)
