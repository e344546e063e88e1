"""Tests for jia_jax/gpu_decode.py's `NvImageCodecDecoder` on CPU, over the Pillow stand-in for
nvImageCodec of tests/gpu_fakes.py: what it asks the library (whole images of the hardware
decoder, regions inside the image of the default one), where the pixels land, what it refuses,
its start-up check, its checks of the array it writes into and its stream synchronisation."""

import io
import logging
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from jia_jax import crop_resize, crop_windows, gpu_decode, nvimgcodec_quiet
from tests.main_util import main_in_process
from tests.gpu_fakes import FakeNvImageCodec, FakeStream

_CANVAS = 32
_OUT = 12


def _jpeg(image: PIL.Image.Image, **options) -> np.ndarray:
    encoded = io.BytesIO()
    image.save(encoded, **{"format": "JPEG", "quality": 90, **options})
    return np.frombuffer(encoded.getvalue(), np.uint8)


def _images(seed: int = 0) -> list[PIL.Image.Image]:
    """Smooth colour images within a canvas and larger than one, one axis or both."""
    rng = np.random.default_rng(seed)
    sizes = [(20, 27), (32, 32), (31, 80), (70, 25), (100, 140)]
    coarse = [PIL.Image.fromarray(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)) for _ in sizes]
    return [c.resize((w, h), PIL.Image.BICUBIC) for c, (h, w) in zip(coarse, sizes, strict=True)]


def _tiles(count: int, device=None) -> jax.Array:
    return gpu_decode.new_tiles(device or jax.devices()[0], count, _CANVAS)


def _decoder(library=None, stream=None):
    library = FakeNvImageCodec() if library is None else library
    stream = FakeStream() if stream is None else stream
    return gpu_decode.NvImageCodecDecoder(jax.devices()[0], library, stream), library, stream


def _plan(images: list[PIL.Image.Image], seed: int = 0) -> crop_resize.TilePlan:
    rng = np.random.default_rng(seed)
    windows = [crop_windows.train_window(rng, *image.size) for image in images]
    boxes, flips = np.array([w[0] for w in windows]), np.array([w[1] for w in windows])
    sizes = np.array([image.size for image in images])
    has_image = np.ones(len(images), bool)
    return crop_resize.plan_tiles(boxes, sizes, flips, has_image, _OUT, _CANVAS)


def _expected(
    pixels: list[np.ndarray], plan: crop_resize.TilePlan, count: int, before: int
) -> np.ndarray:
    """The contract: region t of image t at slot t's top-left corner, every other pixel as it
    was (`before`)."""
    tiles = np.full((count, _CANVAS, _CANVAS, 3), before, np.uint8)
    for t, (example, (top, left, bottom, right)) in enumerate(zip(plan.example, plan.region)):
        tiles[t, : bottom - top, : right - left] = pixels[example][top:bottom, left:right]
    return tiles


def test_tiles_land_in_their_slots_whole_images_by_the_hardware_regions_by_default():
    """Into an array that held other pixels: only the regions are written."""
    images = _images()
    encoded = [_jpeg(image) for image in images]
    pixels = [np.asarray(PIL.Image.open(io.BytesIO(e.tobytes())).convert("RGB")) for e in encoded]
    plan = _plan(images)
    count = len(plan.example) + 3  # padding slots stay as they were
    decoder, library, stream = _decoder()
    library.decoded.clear()
    synchronized = stream.synchronized
    tiles = jnp.full((count, _CANVAS, _CANVAS, 3), 7, jnp.uint8).block_until_ready()
    decoded = decoder([encoded[e] for e in plan.example], plan.region, tiles)
    assert decoded.all()
    np.testing.assert_array_equal(np.asarray(tiles), _expected(pixels, plan, count, 7))
    assert stream.synchronized == synchronized + 1
    # Images within a canvas (the first two) are whole: the hardware decoder's; the rest are
    # regions inside their image: the default decoder's.
    whole = [tuple(r) for e, r in zip(plan.example, plan.region) if e < 2]
    assert [r for b, r in library.decoded if b == "hardware"] == whole
    assert [b for b, _ in library.decoded].count("default") == len(plan.example) - 2


def test_a_batch_is_prepared_while_another_batch_decodes():
    """The host's share of a batch (each JPEG's header parsed, its slots described) does not
    wait for the decoder: while one batch decodes, another's code streams are made."""
    decoder, library, _ = _decoder()
    decoding, finish = threading.Event(), threading.Event()

    def gate():
        decoding.set()
        assert finish.wait(60)  # longer than the test waits for the second batch

    parsed, make = [], library.CodeStream
    library.gate = gate
    library.CodeStream = lambda data: parsed.append(data) or make(data)
    images = _images()[:2]
    encoded = [_jpeg(image) for image in images]
    regions = np.array([[0, 0, image.height, image.width] for image in images])
    batches = [threading.Thread(target=decoder, args=(encoded, regions, _tiles(2)))]
    batches[0].start()
    assert decoding.wait(10)  # the first batch holds the decoder
    parsed.clear()
    batches.append(threading.Thread(target=decoder, args=(encoded, regions, _tiles(2))))
    batches[1].start()
    try:
        deadline = time.monotonic() + 10
        while len(parsed) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(parsed) == 2, "the second batch's headers waited for the first's decoding"
    finally:
        finish.set()
        for batch in batches:
            batch.join()


def test_refused_images_are_reported_and_the_rest_decode():
    """CMYK, PNG and damaged bytes (and a region past what the header says) are left to Pillow;
    a progressive JPEG, refused by the hardware decoder, is decoded by the default one."""
    image = _images()[0]
    baseline = _jpeg(image)
    png = io.BytesIO()
    image.save(png, format="PNG")
    encoded = [
        baseline,
        _jpeg(image.convert("CMYK")),
        np.frombuffer(png.getvalue(), np.uint8),
        baseline[: len(baseline) * 2 // 3],  # truncated: the header reads, the pixels do not
        np.frombuffer(b"not an image", np.uint8),
        baseline,
        _jpeg(image, progressive=True),
        _jpeg(image.convert("L")),
    ]
    whole = [0, 0, image.height, image.width]
    regions = np.array([whole] * 5 + [[0, 0, image.height + 1, image.width]] + [whole] * 2)
    decoder, library, _ = _decoder()
    library.decoded.clear()
    tiles = _tiles(len(encoded))
    decoded = decoder(encoded, regions, tiles)
    assert decoded.tolist() == [True, False, False, False, False, False, True, True]
    assert [b for b, _ in library.decoded] == ["hardware", "hardware", "default"]
    grey = np.asarray(PIL.Image.open(io.BytesIO(encoded[7].tobytes())).convert("RGB"))
    np.testing.assert_array_equal(np.asarray(tiles)[7, : image.height, : image.width], grey)


def test_a_jpeg_cut_short_goes_to_pillow_even_where_the_library_would_decode_it():
    # The GPU's JPEG engines decode a cut JPEG without an error; the CPU path's Pillow refuses
    # it and counts the record as damaged. The decoder must not hand it to the library.
    image = _images()[4]
    whole = _jpeg(image)
    cut = whole[:-100]  # its header whole, its last rows of pixels and end marker missing
    padded = np.concatenate([whole, np.zeros(16, np.uint8)])  # padding after the end marker
    decoder, library, _ = _decoder(FakeNvImageCodec(decodes_cut_jpegs=True))
    library.decoded.clear()
    regions = np.array([[0, 0, _CANVAS, _CANVAS]] * 3)  # a region: the default backends
    decoded = decoder([cut, padded, whole], regions, _tiles(3))
    assert decoded.tolist() == [False, True, True]
    assert len(library.decoded) == 2


def test_without_hardware_decoder_the_default_one_decodes_whole_images(caplog):
    with caplog.at_level(logging.INFO):
        decoder, library, _ = _decoder(FakeNvImageCodec(has_hardware=False))
    assert "hardware JPEG backends on GPU 0: Could not create decoder" in caplog.text
    library.decoded.clear()
    image = _images()[1]
    decoded = decoder([_jpeg(image)], np.array([[0, 0, 32, 32]]), _tiles(1))
    assert decoded.all() and [b for b, _ in library.decoded] == ["default"]


def test_a_library_that_ignores_the_slots_pitch_fails_the_start_up_check(caplog):
    with caplog.at_level(logging.INFO), pytest.raises(
        gpu_decode.DecoderUnavailableError, match="cannot decode a JPEG into a tile on"
    ):
        _decoder(FakeNvImageCodec(ignores_pitch=True))
    assert "levels from Pillow's" in caplog.text or "wrote past region" in caplog.text


def test_a_failed_call_is_synchronised_and_its_tiles_go_to_the_next_decoder(monkeypatch):
    """The hardware decoder raising (a whole call failing) leaves its whole images to the
    default decoder; the stream is synchronised after every call, even one that raises."""
    decoder, library, stream = _decoder()
    hardware = decoder._backends[0].decoder

    def fail(error):
        def decode(*args, **kwargs):
            raise error

        return decode

    monkeypatch.setattr(hardware, "decode", fail(RuntimeError("Something went wrong")))
    library.decoded.clear()
    image = _images()[0]
    synchronized = stream.synchronized
    region = np.array([[0, 0, image.height, image.width]])
    decoded = decoder([_jpeg(image)], region, _tiles(1))
    assert decoded.all() and [b for b, _ in library.decoded] == ["default"]
    assert stream.synchronized == synchronized + 1

    # An error that is a bug, not the library's refusal, is raised, after the synchronisation.
    monkeypatch.setattr(decoder._backends[1].decoder, "decode", fail(KeyError("bug")))
    with pytest.raises(KeyError, match="bug"):
        decoder([_jpeg(image)], region, _tiles(1))
    assert stream.synchronized == synchronized + 2


def test_a_region_larger_than_a_slot_or_a_wrong_array_is_refused_before_anything_is_written():
    """nvImageCodec would write past the slot, or past the array, into memory XLA owns."""
    decoder, library, _ = _decoder()
    library.decoded.clear()
    image = _images()[4]  # 140 x 100
    jpeg, small = _jpeg(image), np.array([[0, 0, 8, 8]])
    with pytest.raises(ValueError, match="do not fit 1 slots of 32 x 32"):
        decoder([jpeg], np.array([[0, 0, 33, 32]]), _tiles(1))
    with pytest.raises(ValueError, match="do not fit 1 slots"):
        decoder([jpeg] * 2, np.concatenate([small, small]), _tiles(1))
    another_device = _tiles(1, jax.devices()[1])
    wrong = [another_device, _tiles(1).astype(np.int32), _tiles(1)[:, :16], _tiles(1)[..., :1]]
    for tiles in wrong:
        with pytest.raises(ValueError, match=r"are not uint8 \[count, canvas, canvas, 3\] on"):
            decoder([jpeg], small, tiles)
    assert library.decoded == []


def test_options_reach_every_decoder_after_the_ones_that_match_pillow():
    # nvImageCodec replaces its default options string with the one given: every decoder asks
    # for libjpeg's interpolated chroma upsampling (Pillow's; ":fancy_upsampling=0", nvJPEG's
    # sample repetition, put its pixels 11 levels from the CPU path's on a GPU), then the extra.
    library = FakeNvImageCodec()
    extra = "nvjpeg_hw_decoder:preallocate_batch_size=256"
    gpu_decode.NvImageCodecDecoder(jax.devices()[0], library, FakeStream(), extra)
    gpu_decode.NvImageCodecDecoder(jax.devices()[0], library, FakeStream())
    assert library.options == [f":fancy_upsampling=1 {extra}"] * 2 + [":fancy_upsampling=1"] * 2


@pytest.mark.parametrize(
    "decode, installed, environ, expected",
    [
        ("auto", True, {}, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}),
        ("gpu", True, {}, {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}),
        ("cpu", True, {}, {}),  # never decodes on the GPU
        ("auto", False, {}, {}),  # cannot: CPU-only installs keep CUDA's defaults
        ("gpu", True, {"CUDA_DEVICE_MAX_CONNECTIONS": "4"}, {}),  # the user's value is kept
    ],
)
def test_a_process_that_may_decode_on_the_gpu_gets_more_hardware_queues(
    monkeypatch, decode, installed, environ, expected
):
    monkeypatch.setattr(gpu_decode, "library_installed", lambda: installed)
    assert gpu_decode.cuda_environment(decode, environ) == expected


# ml_collections loads the config file with the import machinery's deprecated load_module.
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_the_command_line_sets_the_decoders_environment_before_any_mode_runs(
    monkeypatch, tmp_path
):
    """jia_jax.main must set the hardware queues before JAX starts CUDA and nvImageCodec's quiet
    before it is imported (each is read once, then)."""
    from jia_jax import loop  # pylint: disable=import-outside-toplevel

    seen = {}
    for name in ("CUDA_DEVICE_MAX_CONNECTIONS", "PYNVIMGCODEC_VERBOSITY",
                 "NVIMGCODEC_EXTENSIONS_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(gpu_decode, "library_installed", lambda: True)
    (tmp_path / "nvimgcodec" / "extensions").mkdir(parents=True)
    (tmp_path / "nvimgcodec" / "extensions" / "libnvjpeg_ext.so.0.9.0").write_bytes(b"")
    monkeypatch.setattr(nvimgcodec_quiet, "package_folder", lambda: str(tmp_path / "nvimgcodec"))
    monkeypatch.setattr(loop, "train_and_evaluate", lambda *a: seen.update(os.environ))
    main_in_process("--config=configs/digits.py", f"--workdir={tmp_path}")
    assert seen["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert seen["PYNVIMGCODEC_VERBOSITY"] == "1"
    assert os.listdir(seen["NVIMGCODEC_EXTENSIONS_PATH"]) == ["libnvjpeg_ext.so.0.9.0"]
