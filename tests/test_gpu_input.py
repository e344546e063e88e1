"""Tests for the GPU input path (jia_jax/gpu_input.py, record_batches.py, gpu_decode.py) on CPU:
the whole path with a Pillow stand-in for nvImageCodec under the real decoder (tests/gpu_fakes.py),
on the 2x4 mesh of 8 simulated devices, against the CPU path on the same tiny tfds datasets."""

import itertools
import logging
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import PIL.Image
import pytest

from configs import default
from jia_jax import bad_records, crop_resize, gpu_decode, gpu_input, input_pipeline
from jia_jax import mesh as mesh_lib
from jia_jax import models, normalize, record_batches, stage_clock, tfds_input
from scripts.bench import gpu_decode as bench_gpu_decode
from tests import tfds_data
from tests.gpu_fakes import fake_gpu  # noqa: F401  pytest fixture

_SIZE = 8
_CANVAS = 16  # smaller than most crops' reach at _SIZE: several tiles per example
_BATCH = 8
# The device resize against Pillow's, both rounded to uint8 (jia_jax/crop_resize.py).
_LEVELS = 4
_ODD = "jia_test_odd_images"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tfds_data.prepare(tfds_data.JiaTestJpeg, str(tmp_path_factory.mktemp("tfds")))


@pytest.fixture(scope="module")
def odd_dir(tmp_path_factory):
    return tfds_data.prepare(tfds_data.JiaTestOddImages, str(tmp_path_factory.mktemp("odd")))


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.create_mesh(2, 4)


def _data(data_dir, name=tfds_data.NAME, **overrides) -> ml_collections.ConfigDict:
    data = default.get_config().data
    fields = {"image_size": _SIZE, "gpu_canvas": _CANVAS, **overrides}
    data.update(name=name, data_dir=data_dir, **fields)
    return data


def _input(data, mesh, decode, **fields) -> input_pipeline.Input:
    data = _with(data, decode=decode, **fields)
    return input_pipeline.create_input(data, _BATCH, _BATCH, mesh, 0)


def _with(data, **fields):
    data = ml_collections.ConfigDict(data.to_dict())
    data.update(fields)
    return data


def _host(batch):
    return {k: np.asarray(v) for k, v in batch.items()}


def _assert_close_images(gpu, cpu):
    assert gpu.dtype == np.uint8 and gpu.shape == cpu.shape
    assert np.abs(gpu.astype(int) - cpu).max() <= _LEVELS


def test_record_windows_are_the_cpu_paths(data_dir):
    """The host half draws the CPU path's windows: Pillow resizing each record's window, flipped
    as the record says, gives the CPU path's batch bit for bit, for two epochs."""
    part = tfds_input.process_part(tfds_data.NAME, data_dir, "train", 0, 1, drop_remainder=True)
    records = record_batches.train_batches(
        part, local_batch=4, seed=0, start_step=0, process_index=0
    )
    cpu = tfds_data.train_batches(data_dir, image_size=_SIZE, image_dtype="uint8")
    for step, expected in zip(range(6), cpu):
        batch = records[step]
        np.testing.assert_array_equal(batch["label"], expected["label"])
        for i in range(4):
            encoded = batch["encoded"][batch["offsets"][i] : batch["offsets"][i + 1]]
            image = tfds_input._decode_rgb(encoded.tobytes())
            assert image.size == tuple(batch["size"][i])
            box = tuple(batch["box"][i])
            pixels = np.asarray(image.resize((_SIZE, _SIZE), PIL.Image.BILINEAR, box=box))
            pixels = pixels[:, ::-1] if batch["flip"][i] else pixels
            np.testing.assert_array_equal(pixels, expected["image"][i])


def test_device_rows_and_assembly_on_the_8_device_mesh(mesh):
    sharding = mesh_lib.batch_sharding(mesh)
    rows = gpu_input.device_rows(sharding, 16)
    assert [r for _, r in rows] == [slice(2 * k, 2 * k + 2) for k in range(8)]
    assert [d for d, _ in rows] == list(mesh.devices.flat)
    local = np.arange(16 * 3, dtype=np.uint8).reshape(16, 3)
    shards = [jax.device_put(local[r], d) for d, r in reversed(rows)]  # any order
    batch = gpu_input.assemble({"image": shards, "label": np.arange(16)}, sharding, 16)
    expected = jax.make_array_from_process_local_data(sharding, local)
    assert batch["image"].sharding == expected.sharding == batch["label"].sharding
    np.testing.assert_array_equal(batch["image"], expected)
    for got, want in zip(batch["image"].addressable_shards, expected.addressable_shards):
        assert got.device == want.device and got.index == want.index


def test_gpu_path_batches_are_the_cpu_paths_within_the_resize_rounding(
    data_dir, mesh, fake_gpu  # noqa: F811
):
    data = _data(data_dir)
    gpu, cpu = _input(data, mesh, "gpu"), _input(data, mesh, "cpu")
    sharding = mesh_lib.batch_sharding(mesh)
    for got, expected in itertools.islice(zip(gpu.train(0), cpu.train(0)), 3):
        assert got["image"].sharding == sharding and got["label"].sharding == sharding
        np.testing.assert_array_equal(got["label"], expected["label"])
        _assert_close_images(np.asarray(got["image"]), np.asarray(expected["image"]))
    passes = [[_host(b) for b in data.eval()] for data in (gpu, cpu)]
    for got, expected in zip(*passes, strict=True):
        np.testing.assert_array_equal(got["mask"], expected["mask"])
        np.testing.assert_array_equal(got["label"], expected["label"])
        _assert_close_images(got["image"], expected["image"])
        assert np.all(got["image"][got["mask"] == 0] == 0)  # padding


def test_resumed_stream_and_worker_processes_change_nothing(data_dir, mesh, fake_gpu):  # noqa: F811
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # grain's workers read an absl flag
    data = _data(data_dir)
    uninterrupted = list(itertools.islice(_input(data, mesh, "gpu").train(0), 4))
    resumed = itertools.islice(_input(data, mesh, "gpu").train(2), 2)
    for expected, got in zip(uninterrupted[2:], resumed, strict=True):  # across an epoch
        np.testing.assert_array_equal(got["image"], expected["image"])
        np.testing.assert_array_equal(got["label"], expected["label"])
    with_workers = itertools.islice(_input(data, mesh, "gpu", num_workers=2).train(0), 4)
    for expected, got in zip(uninterrupted, with_workers, strict=True):
        np.testing.assert_array_equal(got["image"], expected["image"])


def test_the_gpu_paths_train_stream_times_its_input_thread_and_eval_does_not(
    data_dir, mesh, fake_gpu  # noqa: F811
):
    streams = _input(_data(data_dir), mesh, "gpu")
    assert streams.stages is not None
    list(streams.eval())
    assert streams.stages.take() == {}
    next(streams.train(0))
    means = streams.stages.take()
    assert set(means) == {"read", "decode"} and min(means.values()) >= 0, means
    assert _input(_data(data_dir), mesh, "cpu").stages is None


def test_refused_images_are_the_cpu_paths_examples(
    odd_dir, mesh, caplog, fake_gpu  # noqa: F811
):
    """CMYK and PNG records (refused by the decoder) are the CPU path's examples, bit for bit; a
    grey-scale JPEG decodes on the device, and a progressive one too, by the default backends
    after the hardware decoder refused it. Every image fits in a 64 canvas: decoded whole."""
    data = _data(odd_dir, name=_ODD, gpu_canvas=64)
    gpu, cpu = _input(data, mesh, "gpu"), _input(data, mesh, "cpu")
    refused = {3, 5, 13}
    seen = set()
    with caplog.at_level(logging.WARNING):
        batches = list(itertools.islice(zip(gpu.train(0), cpu.train(0)), 3))
        batches += list(zip(gpu.eval(), cpu.eval()))
    for got, expected in batches:
        got, expected = _host(got), _host(expected)
        np.testing.assert_array_equal(got["label"], expected["label"])
        fell_back = np.isin(got["label"], list(refused)) & (got.get("mask", 1) == 1)
        np.testing.assert_array_equal(got["image"][fell_back], expected["image"][fell_back])
        _assert_close_images(got["image"], expected["image"])
        seen |= set(got["label"][fell_back].tolist())
    labels = np.concatenate([b[0]["label"] for b in batches])
    assert seen == refused and 7 in labels and 9 in labels
    assert any("decoded with Pillow on the CPU" in r.getMessage() for r in caplog.records)
    # 8 devices in this one process: the advice to run one process per GPU.
    assert "Decoding on 8 GPUs from one process" in caplog.text
    assert "python -m jia_jax.main trains so by itself" in caplog.text
    # The default backends decoded no whole image but the progressive one (27 x 42), beside
    # the start-up checks' probe (150 x 200).
    whole = {region for backend, region in fake_gpu.decoded if backend == "default"}
    assert whole - {(0, 0, 150, 200), (8, 24, 144, 200)} == {(0, 0, 27, 42)}


def test_two_decoders_a_device_give_the_same_batches_refused_images_included(
    odd_dir, mesh, fake_gpu  # noqa: F811
):
    """`data.gpu_decode_depth=2`: each device's two decoders take the batches in turn; the
    batches, the CPU path's examples for refused images among them, are those of one decoder."""
    data = _data(odd_dir, name=_ODD, gpu_canvas=64)
    one = _input(data, mesh, "gpu")
    made = len(fake_gpu.options)  # nvImageCodec decoders of one decoder per device
    two = _input(data, mesh, "gpu", gpu_decode_depth=2)
    assert len(fake_gpu.options) == 3 * made
    pairs = list(itertools.islice(zip(one.train(0), two.train(0)), 3))
    pairs += list(zip(one.eval(), two.eval(), strict=True))
    for expected, got in pairs:
        for key in expected:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]))
    with pytest.raises(ValueError, match=r"data\.gpu_decode_depth=0 must be at least 1"):
        _input(data, mesh, "gpu", gpu_decode_depth=0)


def test_tile_ring_depth_reaches_every_ring_and_must_be_positive(
    odd_dir, mesh, fake_gpu  # noqa: F811
):
    data = _data(odd_dir, name=_ODD, gpu_canvas=64)
    for depth in (3, 8):
        streams = gpu_input.GpuStreams.create(
            _with(data, decode="gpu", gpu_tile_ring_depth=depth, gpu_decode_depth=2),
            mesh_lib.batch_sharding(mesh), _BATCH, _BATCH, 0,
        )
        rings = [d.ring for decoders in streams.decoders for d in decoders.values()]
        assert len(rings) == 2 * len(mesh.devices.flat)
        assert {ring._depth for ring in rings} == {depth}  # pylint: disable=protected-access
    with pytest.raises(ValueError, match=r"data\.gpu_tile_ring_depth=0 must be at least 1"):
        _input(data, mesh, "gpu", gpu_tile_ring_depth=0)


def test_crop_kernel_reaches_each_decode_and_must_be_known(
    odd_dir, mesh, fake_gpu, monkeypatch  # noqa: F811
):
    data = _data(odd_dir, name=_ODD, gpu_canvas=64)
    assert data.gpu_crop_kernel == crop_resize.DEFAULT_KERNEL == "pallas"
    with pytest.raises(ValueError, match=r"data\.gpu_crop_kernel='triton' must be one of"):
        _input(data, mesh, "gpu", gpu_crop_kernel="triton")
    # Triton's products take blocks of 16 or more: a canvas of 72 has none along the rows.
    odd_canvas = _with(data, gpu_canvas=72)
    with pytest.raises(ValueError, match=r"'pallas' needs a canvas that is a multiple of 16 "
                                         r"\(data\.gpu_canvas=72\); or set it to 'xla'"):
        gpu_input.check_crop_kernel(odd_canvas, {"gpu"})
    with pytest.raises(ValueError, match=r"'pallas' needs an image size of at least 9 "
                                         r"\(data\.image_size=8\)"):
        gpu_input.check_crop_kernel(_with(data, image_size=8), {"cpu", "gpu"})
    gpu_input.check_crop_kernel(_with(odd_canvas, gpu_crop_kernel="xla"), {"gpu"})  # any canvas
    # Off GPUs XLA's products crop whatever the setting, so the default asks nothing of the
    # shapes there (these CPU devices, an 8-pixel image size).
    _input(data, mesh, "gpu", gpu_canvas=72)
    seen = []
    decode = gpu_input.decode_rows

    def spy(*args):
        seen.append(args[-1])
        return decode(*args)

    monkeypatch.setattr(gpu_input, "decode_rows", spy)
    streams = gpu_input.GpuStreams.create(
        _with(data, decode="gpu", gpu_crop_kernel="pallas", image_size=16),
        mesh_lib.batch_sharding(mesh),
        _BATCH, _BATCH, 0,
    )
    next(iter(streams.train(0)))  # on these CPU devices decode_rows then takes XLA's products
    assert seen and set(seen) == {"pallas"}


def test_decode_sets_take_batches_in_turn_and_the_next_is_under_way_first(monkeypatch):
    # Stand-ins for the decoders (decode_rows returns the set's name as the batch's pixels).
    monkeypatch.setattr(
        gpu_input, "decode_rows", lambda batch, rows, decoder, *_: (decoder, [])
    )
    pulled = []

    def records():
        for k in range(5):
            pulled.append(k)
            yield {"label": np.array([k, k])}

    for sets, ahead in (([["a"]], 2), ([["a"], ["b"]], 4)):
        pulled.clear()
        decoded = gpu_input.device_batches(
            records(), [[(d, slice(0, 2)) for d in s] for s in sets], None,
            first_step=0, image_size=8, canvas=16,
        )
        first = next(decoded)
        # Each set had two batches under way before the first came out.
        assert len(pulled) == ahead
        out = [first, *decoded]
        assert [int(b["label"][0]) for b in out] == [0, 1, 2, 3, 4]
        names = [s[0] for s in sets]
        assert [b["image"] for b in out] == [[names[k % len(names)]] for k in range(5)]


def test_batches_left_unfinished_close_from_one_of_their_own_decode_threads(monkeypatch):
    # Garbage collection may finalise an unfinished `device_batches` on any thread, one of its
    # decode threads included: closing it there must not wait for that thread to end.
    started, closed, errors = threading.Event(), threading.Event(), []
    holder = {}

    def decode(batch, rows, decoder, *_):
        if batch["label"][0] == 1:  # under way while the consumer holds batch 0
            started.wait(10)
            try:
                holder["decoded"].close()
            except Exception as error:  # noqa: BLE001 - the failure this test looks for
                errors.append(error)
            closed.set()
        return decoder, []

    monkeypatch.setattr(gpu_input, "decode_rows", decode)
    records = ({"label": np.array([k])} for k in range(4))
    holder["decoded"] = gpu_input.device_batches(
        records, [[("a", slice(0, 1))]], None, first_step=0, image_size=8, canvas=16
    )
    assert int(next(holder["decoded"])["label"][0]) == 0
    started.set()
    assert closed.wait(10)
    assert errors == []
    assert next(holder["decoded"], None) is None  # closed: nothing more comes out


def test_the_clock_counts_each_batch_wait_for_records_and_for_decoding(monkeypatch):
    # Records arrive 40 ms apart and a decoder takes 200 ms a batch, one batch at a time. With
    # two batches under way the input thread waits 160 ms for each of the first three decodes
    # (the next record was read meanwhile) and 200 for the last: a mean of 170.
    lock = threading.Lock()

    def decode(batch, rows, decoder, *_):
        with lock:
            time.sleep(0.2)
        return decoder, []

    monkeypatch.setattr(gpu_input, "decode_rows", decode)

    def records():
        for k in range(4):
            time.sleep(0.04)
            yield {"label": np.array([k])}

    clock = stage_clock.StageClock()
    decoded = gpu_input.device_batches(
        records(), [[("a", slice(0, 1))]], None, first_step=0, image_size=8, canvas=16,
        clock=clock,
    )
    assert len(list(decoded)) == 4
    means = clock.take()
    assert set(means) == {"read", "decode"}
    # Sleeps last at least as asked; a loaded 2-core machine may add tens of ms (to a read's
    # sleep, and so take them from a decode's wait), not less.
    assert 40 <= means["read"] < 200 and 100 <= means["decode"] < 400, means
    assert clock.take() == {}


@pytest.mark.parametrize("damage", [tfds_data.truncate_jpeg, tfds_data.break_jpeg])
def test_damaged_records_are_named_and_replaced_as_on_the_cpu_path(
    data_dir, mesh, tmp_path, caplog, damage, fake_gpu  # noqa: F811
):
    """A record whose header reads but whose pixels do not (truncated), or whose header does not
    read: replaced by the same record as on the CPU path, and named once."""
    damaged = tfds_data.copy(data_dir, tmp_path)
    position = damage(damaged, "train", 5)
    data = _data(damaged, max_bad_records=1)
    gpu, cpu = _input(data, mesh, "gpu"), _input(data, mesh, "cpu")
    with caplog.at_level(logging.WARNING):
        batches = list(itertools.islice(zip(gpu.train(0), cpu.train(0)), 3))
    for got, expected in batches:
        np.testing.assert_array_equal(got["label"], expected["label"])
        _assert_close_images(np.asarray(got["image"]), np.asarray(expected["image"]))
    assert 5 not in np.concatenate([np.asarray(b[0]["label"]) for b in batches])
    named = [r for r in caplog.records if f"record {position} of" in r.getMessage()]
    assert len(named) == 2  # once per path
    strict = _input(data, mesh, "gpu", max_bad_records=0)
    with pytest.raises(bad_records.CorruptDatasetError, match=f"Cannot read record {position} "):
        list(itertools.islice(strict.train(0), 3))


def test_decode_choice_is_checked_and_auto_falls_back_to_the_cpu(monkeypatch, caplog):
    with pytest.raises(ValueError, match="needs JAX on GPUs.*data.decode=cpu"):
        input_pipeline.resolve_decode("gpu")
    assert input_pipeline.resolve_decode("auto") == "cpu"
    monkeypatch.setattr(gpu_decode, "available", lambda: True)
    assert input_pipeline.resolve_decode("auto") == "gpu"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.99")
    with pytest.raises(ValueError, match="XLA_PYTHON_CLIENT_MEM_FRACTION=0.99 leaves less"):
        input_pipeline.resolve_decode("gpu")
    with caplog.at_level(logging.WARNING):
        assert input_pipeline.resolve_decode("auto") == "cpu"
    assert "Decoding on the CPU" in caplog.text
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    assert input_pipeline.resolve_decode("gpu") == "gpu"
    data = default.get_config().data
    data.decode = "GPU"
    with pytest.raises(ValueError, match="data.decode='GPU' is not one of"):
        input_pipeline.create_input(data, 8, 8, mesh_lib.create_mesh(2, 4), 0)
    data.decode, data.num_workers = "auto", -1  # read as 0 before the check
    with pytest.raises(ValueError, match=r"data.num_workers=-1 must be >= 0 \(0 reads in"):
        input_pipeline.create_input(data, 8, 8, mesh_lib.create_mesh(2, 4), 0)


@pytest.mark.parametrize(
    "field, value, batches, message",
    [
        ("image_size", 0, (8, 8), r"data.image_size=0 must be positive"),
        (None, None, (12, 8), r"global_batch_size=12 must be divisible by the device count \(8\)"),
        (None, None, (8, 0), r"eval_batch_size=0 must be positive \(a multiple of 8\)"),
        (None, None, (2048, 8), r"global_batch_size=2048 exceeds the digits train set \(1437 "),
    ],
    ids=["image_size", "global_batch", "eval_batch", "digits_too_small"],
)
def test_create_input_names_what_to_fix(field, value, batches, message):
    data = default.get_config().data
    data.name = "digits"
    if field:
        data[field] = value
    with pytest.raises(ValueError, match=message):
        input_pipeline.create_input(data, *batches, mesh_lib.create_mesh(2, 4), 0)


def test_decode_gpu_asked_for_a_dataset_without_jpegs_is_said_to_be_ignored(caplog):
    data = default.get_config().data
    data.name = "synthetic"
    for decode, warned in (("gpu", True), ("auto", False)):
        data.decode = decode
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            input_pipeline.create_input(data, 8, 8, mesh_lib.create_mesh(2, 4), 0)
        assert ("data.decode='gpu' is ignored: data.name='synthetic'" in caplog.text) == warned


def test_the_gpu_path_warns_where_cuda_started_without_its_hardware_queues(monkeypatch, caplog):
    monkeypatch.setattr(gpu_decode, "available", lambda: True)
    monkeypatch.setattr(gpu_decode, "library_installed", lambda: True)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    with caplog.at_level(logging.WARNING):
        assert input_pipeline.resolve_decode("auto") == "gpu"
    assert "CUDA_DEVICE_MAX_CONNECTIONS is not set" in caplog.text
    assert "set CUDA_DEVICE_MAX_CONNECTIONS=32 before JAX starts" in caplog.text
    caplog.clear()
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "16")  # the user's choice: no warning
    with caplog.at_level(logging.WARNING):
        assert input_pipeline.resolve_decode("gpu") == "gpu"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in caplog.text


def test_a_decoder_that_cannot_decode_stops_gpu_and_turns_auto_to_the_cpu(
    data_dir, mesh, monkeypatch, caplog, fake_gpu  # noqa: F811
):
    def unavailable(device, **_):
        raise gpu_decode.DecoderUnavailableError(f"nvImageCodec cannot decode on {device}")

    monkeypatch.setattr(gpu_decode, "new_decoder", unavailable)
    data = _data(data_dir)
    with pytest.raises(ValueError, match="nvImageCodec cannot decode on"):
        _input(data, mesh, "gpu")
    with caplog.at_level(logging.INFO):
        auto = _input(data, mesh, "auto")
    assert "Decoding on the CPU: nvImageCodec cannot decode" in caplog.text
    assert "Decoding jia_test_jpeg's JPEGs on the CPU." in caplog.text
    expected = next(_input(data, mesh, "cpu").train(0))
    np.testing.assert_array_equal(next(auto.train(0))["image"], expected["image"])


def test_eval_top1_agrees_with_the_cpu_path_within_the_margin_bound(
    data_dir, mesh, fake_gpu  # noqa: F811
):
    """Same parameters, same images: top-1 can change only on examples whose CPU-path margin
    (top logit minus the next) is at most twice the largest logit change between the paths
    (scripts/bench/gpu_decode.py). Two classifiers: the trainer's ResNet-18 as initialised, and
    one that reads the label from the green level (top-1 = 1 on these images)."""
    data = _data(data_dir, image_size=16, gpu_canvas=32)
    passes = [[_host(b) for b in _input(data, mesh, decode).eval()] for decode in ("gpu", "cpu")]
    gpu, cpu = ({k: np.concatenate([b[k] for b in p]) for k in p[0]} for p in passes)
    classes = tfds_data.NUM_TRAIN + tfds_data.NUM_EVAL
    model = models.create_model(
        "resnet18", num_classes=classes, width=4, small_inputs=True, dtype=jnp.float32
    )
    # Jitted: one compile each instead of hundreds of op-by-op dispatches (and their compiles).
    variables = jax.jit(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)
    )()
    forward = jax.jit(
        lambda images: model.apply(
            variables, normalize.model_input(images, jnp.float32), train=False
        )
    )

    def resnet(images):
        return np.asarray(forward(images))

    def green(images):
        level = images[..., 1].mean(axis=(1, 2))[:, None]
        return -np.abs(level - tfds_data.GREEN_STEP * np.arange(classes))

    for logits in (resnet, green):
        result = bench_gpu_decode.compare_predictions(
            logits(cpu["image"]), logits(gpu["image"]), cpu["label"], cpu["mask"]
        )
        assert result["examples"] == tfds_data.NUM_EVAL
        assert result["bound_holds"], result
        # Here no example is that close: the bound is 0, and so the top-1 are equal.
        assert result["top1_bound"] == 0 and result["top1_gpu"] == result["top1_cpu"], result
    assert result["top1_cpu"] == 1.0
    pixels = bench_gpu_decode.pixel_change(cpu["image"], gpu["image"], cpu["mask"])
    assert 0 < pixels["max_pixel_change"] <= _LEVELS


def test_trainer_runs_and_evaluates_on_the_gpu_path(data_dir, tmp_path, fake_gpu):  # noqa: F811
    """The whole loop with data.decode='gpu' (Pillow standing in for nvImageCodec): 2 steps on the
    2x4 mesh, then an eval that counts every example once."""
    from jia_jax import loop

    config = tfds_data.trainer_config(data_dir, decode="gpu", gpu_canvas=32)
    results = loop.train_and_evaluate(config, str(tmp_path))
    assert results["eval/examples"] == tfds_data.NUM_EVAL
    assert np.isfinite(results["train/loss"])


@pytest.mark.parametrize(
    "fancy, option", [(True, ":fancy_upsampling=1"), (False, ":fancy_upsampling=0")]
)
def test_the_config_chooses_how_every_decoder_upsamples_chroma(
    data_dir, mesh, fake_gpu, fancy, option  # noqa: F811
):
    _input(_data(data_dir), mesh, "gpu", gpu_fancy_upsampling=fancy)
    assert fake_gpu.options and set(fake_gpu.options) == {option}


def test_the_config_passes_its_decoder_options_to_every_decoder(
    data_dir, mesh, fake_gpu  # noqa: F811
):
    extra = "nvjpeg_hw_decoder:preallocate_batch_size=256"
    _input(_data(data_dir), mesh, "gpu", gpu_decoder_options=extra)
    assert fake_gpu.options and set(fake_gpu.options) == {f":fancy_upsampling=1 {extra}"}
