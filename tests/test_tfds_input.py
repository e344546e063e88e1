"""Tests for jia_jax.tfds_input on a tiny tfds dataset of generated JPEGs, written in the test."""

import gc
import itertools
import logging
import math
import os
import re
import weakref

import grain
import numpy as np
import PIL.Image
import pytest
import tensorflow_datasets as tfds
from absl import flags
from google.protobuf import message

from jia_jax import bad_records, example_records, tfds_input
from tests import tfds_data

_NAME = tfds_data.NAME
_NUM_TRAIN, _NUM_EVAL = tfds_data.NUM_TRAIN, tfds_data.NUM_EVAL
_GREEN_STEP = tfds_data.GREEN_STEP
_SIZE = 8
# Pixel error allowed after JPEG (quality 100, no chroma subsampling) and resizing a flat channel.
_PIXEL_TOL = 3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tfds_data.prepare(tfds_data.JiaTestJpeg, str(tmp_path_factory.mktemp("tfds")))


def _train(data_dir, **overrides):
    return tfds_data.train_batches(data_dir, **{"image_size": _SIZE, **overrides})


def _eval(data_dir, **overrides):
    kwargs = {
        "data_dir": data_dir,
        "split": "validation",
        "image_size": _SIZE,
        "local_batch": 3,
        "process_index": 0,
        "process_count": 1,
        "num_threads": 2,
    }
    return list(tfds_input.eval_batches(_NAME, **{**kwargs, **overrides}))


def _denormalize(image):
    return image.astype(np.float64) * tfds_input.IMAGENET_STD + tfds_input.IMAGENET_MEAN


def _assert_close(pixels, expected):
    np.testing.assert_allclose(pixels, np.broadcast_to(expected, pixels.shape), atol=_PIXEL_TOL)


def test_dataset_info(data_dir):
    classes = _NUM_TRAIN + _NUM_EVAL
    names = tuple(str(i) for i in range(classes))  # a ClassLabel's default names
    assert tfds_input.dataset_info(_NAME, data_dir) == (classes, _NUM_TRAIN, _NUM_EVAL, names)
    assert tfds_input.dataset_info(_NAME, data_dir, "train[:50%]", "validation[:2]")[:3] == (
        19,
        6,
        2,
    )


@pytest.mark.parametrize("split", ["train", "validation", "train[3:9]"])
def test_records_are_tfds_own_examples(data_dir, split):
    # The reference: tfds's generic deserialization of every feature.
    reference = tfds.builder(_NAME, data_dir=data_dir).as_data_source(
        split=split, decoders={"image": tfds.decode.SkipDecoding()}
    )
    part = tfds_input.process_part(_NAME, data_dir, split, 0, 1, drop_remainder=False)
    assert len(part.source) == len(reference) > 0
    for i in range(len(reference)):
        record, expected = part.source[i], reference[i]
        assert record["image"] == expected["image"] and record["label"] == expected["label"]


def test_a_record_without_one_label_or_not_an_example_is_refused():
    serialize = tfds.features.FeaturesDict({"image": tfds.features.Image(encoding_format="jpeg")})
    image = tfds_data.jpeg(PIL.Image.new("RGB", (4, 4)))
    unlabelled = serialize.serialize_example({"image": image})
    with pytest.raises(ValueError, match="0 labels"):
        example_records.parse(unlabelled)
    with pytest.raises(message.DecodeError):
        example_records.parse(b"\xff\xd8 not an Example")
    with pytest.raises(ValueError, match="0 labels"):
        example_records.parse(b"")


def test_a_dataset_without_an_image_and_a_label_feature_is_refused_naming_them():
    image, label = tfds.features.Image(), tfds.features.ClassLabel(num_classes=3)
    tfds_input.check_features("fine", tfds.features.FeaturesDict({"image": image, "label": label}))
    renamed = tfds.features.FeaturesDict({"picture": image, "label": label})
    with pytest.raises(ValueError, match=r"lacks the feature 'image' \(Image\).*'picture'"):
        tfds_input.check_features("renamed", renamed)
    plain = tfds.features.Tensor(shape=(), dtype=np.int64)
    both = tfds.features.FeaturesDict({"image": plain, "label": plain})
    with pytest.raises(ValueError, match=r"'image' \(Image\) and 'label' \(ClassLabel\)"):
        tfds_input.check_features("both", both)


def test_train_batches_shapes_normalization_and_flips(data_dir):
    batches = list(itertools.islice(_train(data_dir), 6))  # two epochs
    for batch in batches:
        assert batch["image"].shape == (4, _SIZE, _SIZE, 3) and batch["image"].dtype == np.float32
        assert batch["label"].shape == (4,) and batch["label"].dtype == np.int32
    images = np.concatenate([_denormalize(b["image"]) for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    # Normalisation inverted in float64: green and blue are flat, so any crop keeps their levels.
    _assert_close(images[..., 1], _GREEN_STEP * labels[:, None, None])
    _assert_close(images[..., 2], 128)
    # Red ramps up left to right in every source image; a flip makes it ramp down.
    slope = images[:, :, -1, 0].mean(axis=1) - images[:, :, 0, 0].mean(axis=1)
    assert np.all(np.abs(slope) > 1)
    assert 0 < np.sum(slope < 0) < len(slope)  # some flipped, some not (p of failing: 2^-23)


def test_processes_read_disjoint_shards_and_reshuffle_each_epoch(data_dir):
    per_process = []
    for process_index in range(2):
        batches = _train(data_dir, local_batch=2, process_index=process_index, process_count=2)
        labels = np.concatenate([next(batches)["label"] for _ in range(6)])  # two epochs of 6
        first, second = labels[:6], labels[6:]
        assert sorted(first) == sorted(second) and len(set(first)) == 6
        assert not np.array_equal(first, second)
        per_process.append(set(first))
    assert per_process[0].isdisjoint(per_process[1])
    assert per_process[0] | per_process[1] == set(range(_NUM_TRAIN))


def test_resume_reproduces_the_uninterrupted_stream(data_dir):
    uninterrupted = list(itertools.islice(_train(data_dir), 5))
    resumed = list(itertools.islice(_train(data_dir, start_step=2, num_threads=1), 3))
    for expected, got in zip(uninterrupted[2:], resumed, strict=True):  # crosses an epoch boundary
        np.testing.assert_array_equal(got["image"], expected["image"])
        np.testing.assert_array_equal(got["label"], expected["label"])
    reseeded = next(_train(data_dir, seed=1))
    assert not np.array_equal(reseeded["image"], uninterrupted[0]["image"])


@pytest.mark.parametrize("process_count, local_batch", [(1, 4), (2, 3)])
def test_eval_counts_every_example_exactly_once(data_dir, process_count, local_batch):
    per_process = [
        _eval(data_dir, local_batch=local_batch, process_index=p, process_count=process_count)
        for p in range(process_count)
    ]
    # Every process takes part in every eval step, even one whose part runs out first.
    num_batches = {len(batches) for batches in per_process}
    assert num_batches == {math.ceil(math.ceil(_NUM_EVAL / process_count) / local_batch)}
    batches = [b for process_batches in per_process for b in process_batches]
    labels = np.concatenate([b["label"] for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    images = np.concatenate([_denormalize(b["image"]) for b in batches])
    assert mask.dtype == np.float32 and set(np.unique(mask)) <= {0.0, 1.0}
    assert sorted(labels[mask == 1]) == list(range(_NUM_TRAIN, _NUM_TRAIN + _NUM_EVAL))
    real = images[mask == 1]
    _assert_close(real[..., 1], _GREEN_STEP * labels[mask == 1, None, None])
    # The centre crop keeps the ramp's direction (no flip in eval).
    assert np.all(real[:, :, -1, 0] > real[:, :, 0, 0])


def test_missing_or_unprepared_dataset_raises_one_clear_error(tmp_path):
    with pytest.raises(tfds_input.DatasetNotPreparedError, match="tfds build no_such_dataset"):
        tfds_input.dataset_info("no_such_dataset", str(tmp_path))
    imagenet_hint = "--manual_dir=.*ILSVRC2012_img_train.tar"
    with pytest.raises(tfds_input.DatasetNotPreparedError, match=imagenet_hint):
        tfds_input.train_batches(
            "imagenet2012",
            data_dir=str(tmp_path),
            split="train",
            image_size=_SIZE,
            local_batch=1,
            seed=0,
            start_step=0,
            process_index=0,
            process_count=1,
        )


def test_bfloat16_images_are_the_float32_images_rounded(data_dir):
    float32 = next(_train(data_dir))
    bfloat16 = next(_train(data_dir, image_dtype="bfloat16"))
    assert bfloat16["image"].dtype == np.dtype("bfloat16")
    # Bitwise: the same cast (round to nearest even) the model's first layer would apply.
    np.testing.assert_array_equal(
        bfloat16["image"].view(np.uint16), float32["image"].astype("bfloat16").view(np.uint16)
    )


def test_worker_processes_yield_the_same_batches(data_dir):
    # grain's workers read an absl flag; pytest parses none.
    flags.FLAGS.mark_as_parsed()
    in_process = list(itertools.islice(_train(data_dir), 4))
    with_workers = list(itertools.islice(_train(data_dir, num_workers=2), 4))
    for expected, got in zip(in_process, with_workers, strict=True):
        np.testing.assert_array_equal(got["image"], expected["image"])
        np.testing.assert_array_equal(got["label"], expected["label"])


def test_workers_hand_over_only_large_arrays_in_shared_memory():
    """grain gives each array a worker hands over a shared-memory segment (this process maps
    it, and unmaps it when freed) unless told a size below which to pickle it: the few-KiB
    fields of a batch travel pickled, the large ones still in shared memory."""
    flags.FLAGS.mark_as_parsed()
    big = tfds_input.SHARED_MEMORY_MIN_BYTES
    batches = grain.MapDataset.range(3).map(
        lambda i: {"encoded": np.full(big, i, np.uint8), "label": np.full(64, i, np.int32)}
    )
    got = list(tfds_input.host_iterator(batches, num_threads=1, num_workers=1))
    assert len(got) == 3
    for i, batch in enumerate(got):
        assert type(batch["label"]) is np.ndarray  # pickled: no segment of its own
        assert type(batch["encoded"]) is not np.ndarray  # grain's shared-memory array
        np.testing.assert_array_equal(batch["encoded"], np.full(big, i, np.uint8))
        np.testing.assert_array_equal(batch["label"], np.full(64, i, np.int32))


def test_a_finite_streams_batches_in_shared_memory_are_freed_once_it_ends():
    """grain keeps the last element of a finite stream in a reference cycle; unfreed, its shared
    memory outlived the eval pass and Python warned at exit of a leaked segment. The collector is
    off here so that only the iterator's own collection can free it."""
    flags.FLAGS.mark_as_parsed()
    big = tfds_input.SHARED_MEMORY_MIN_BYTES
    batches = grain.MapDataset.range(3).map(lambda i: {"encoded": np.full(big, i, np.uint8)})
    alive = []
    gc.disable()
    try:
        for batch in tfds_input.host_iterator(batches, num_threads=1, num_workers=1):
            alive.append(weakref.ref(batch["encoded"]))
        del batch
        assert len(alive) == 3 and [a() is None for a in alive] == [True] * 3
    finally:
        gc.enable()


def test_trainer_runs_and_evaluates_on_a_tfds_dataset(data_dir, tmp_path):
    """The whole loop on a prepared tfds dataset: 2x4 mesh, eval counts each example once."""
    from jia_jax import loop

    results = loop.train_and_evaluate(tfds_data.trainer_config(data_dir), str(tmp_path))
    assert results["eval/examples"] == _NUM_EVAL
    assert 0.0 <= results["eval/top1"] <= results["eval/top5"] <= 1.0
    assert np.isfinite(results["train/loss"])


# Damaged datasets: a copy of the test dataset with one record or one shard broken.

@pytest.mark.parametrize(
    "damage, error",
    [
        (tfds_data.break_jpeg, "UnidentifiedImageError"),
        (tfds_data.break_chunk, "RuntimeError: Corrupted Riegeli"),
    ],
)
def test_a_damaged_record_stops_the_run_naming_file_and_record(data_dir, tmp_path, damage, error):
    damaged = tfds_data.copy(data_dir, tmp_path)
    position = damage(damaged, "train", 5)
    batches = _train(damaged)
    pattern = rf"Cannot read record {position} of {tfds_data.shard(damaged, 'train')} \({error}"
    with pytest.raises(bad_records.CorruptDatasetError, match=pattern) as info:
        list(itertools.islice(batches, 3))  # one epoch
    assert "data.max_bad_records=0" in str(info.value)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_records_up_to_the_limit_are_replaced_the_same_way_every_time(
    data_dir, tmp_path, caplog, num_workers
):
    flags.FLAGS.mark_as_parsed()  # grain's workers read an absl flag
    damaged = tfds_data.copy(data_dir, tmp_path)
    position = tfds_data.break_jpeg(damaged, "train", 5)
    order = tfds_data.labels_in_shard_order(damaged, "train")
    replacement = order[(position + 1) % len(order)]  # the next record in the shard
    clean = list(itertools.islice(_train(data_dir), 6))  # two epochs: record 5 twice
    with caplog.at_level(logging.WARNING):
        stream = _train(damaged, max_bad_records=1, num_workers=num_workers)
        replaced = list(itertools.islice(stream, 6))
    for expected, got in zip(clean, replaced, strict=True):
        bad = expected["label"] == 5
        assert np.sum(bad) <= 1
        np.testing.assert_array_equal(got["label"], np.where(bad, replacement, expected["label"]))
        # Every other example is untouched, bit for bit (same record, same random crop).
        np.testing.assert_array_equal(got["image"][~bad], expected["image"][~bad])
        # The replacement's image is the replacement record's (its green level names it).
        _assert_close(_denormalize(got["image"][bad])[..., 1], _GREEN_STEP * replacement)
    assert sum(np.sum(b["label"] == 5) for b in clean) == 2
    # Met twice, logged and counted once, by this process (after its workers).
    warnings = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    named = f"record {position} of {tfds_data.shard(damaged, 'train')}"
    assert len(warnings) == 1 and named in warnings[0]
    # A resumed stream replaces it the same way.
    resumed = list(itertools.islice(_train(damaged, start_step=2, max_bad_records=1), 4))
    for expected, got in zip(replaced[2:], resumed, strict=True):
        np.testing.assert_array_equal(got["image"], expected["image"])
        np.testing.assert_array_equal(got["label"], expected["label"])


def test_more_bad_records_than_the_limit_stop_the_run(data_dir, tmp_path):
    damaged = tfds_data.copy(data_dir, tmp_path)
    tfds_data.break_jpeg(damaged, "train", 3)
    tfds_data.break_jpeg(damaged, "train", 7)
    with pytest.raises(bad_records.CorruptDatasetError, match="2 unreadable records, more than "):
        list(itertools.islice(_train(damaged, max_bad_records=1), 3))


def test_eval_leaves_a_bad_record_out_and_counts_it(data_dir, tmp_path):
    damaged = tfds_data.copy(data_dir, tmp_path)
    position = tfds_data.break_jpeg(damaged, "validation", 14)
    batches = _eval(damaged, max_bad_records=1)
    labels = np.concatenate([b["label"] for b in batches])
    mask = np.concatenate([b["mask"] for b in batches])
    assert sorted(labels[mask == 1]) == [i for i in range(12, 12 + _NUM_EVAL) if i != 14]
    with pytest.raises(bad_records.CorruptDatasetError, match=f"Cannot read record {position} "):
        _eval(damaged)


@pytest.mark.parametrize("size", [65536, 9000])
def test_a_truncated_shard_is_named_before_any_batch(data_dir, tmp_path, size):
    damaged = tfds_data.copy(data_dir, tmp_path)
    shard = tfds_data.shard(damaged, "train")
    # 65536: the footer (the index of records) is cut off; 9000: not even one 64 KiB block.
    os.truncate(shard, size)
    expected = (
        f"{shard} holds 0 readable records where the dataset's metadata lists 12: "
        "the file is truncated or damaged."
    )
    with pytest.raises(bad_records.CorruptDatasetError, match=re.escape(expected)):
        _train(damaged)
