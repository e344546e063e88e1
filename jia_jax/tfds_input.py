"""Per-process host batches from a prepared tfds image-classification dataset or image folder.

Reads a dataset prepared with tfds in the ArrayRecord file format (`imagenet2012` or any dataset
with an `image` and a `label` feature), or a folder of class sub-folders of images (name
`image_folder`, jia_jax/image_folder.py), through `grain`, which gives random access by index. That
makes the train stream a pure function of (seed, process, step): resuming at step k computes where
step k starts instead of replaying k steps. JPEGs are decoded and resized with Pillow; TensorFlow
is not needed at run time. Nothing here touches the network: an unprepared dataset raises
`DatasetNotPreparedError` with the command that prepares it. A damaged shard stops the run at once,
naming the file; a damaged record (bad JPEG bytes, a failed checksum) is named, counted and
replaced the same way every time, up to `max_bad_records` (jia_jax/bad_records.py).

Preprocessing is the standard ResNet one. Train: random-resized crop (area 8-100% of the image,
aspect ratio 3/4-4/3, at most 10 tries, else a centre crop), horizontal flip, bilinear resize to
`image_size`. Eval: centre crop of 0.875 of the shorter side resized to `image_size` (the same
pixels as resizing the shorter side to `image_size / 0.875` and cropping the centre). Both
normalise by the ImageNet mean and std and return NHWC images in `image_dtype` and int32 labels.

`image_dtype` uint8 (what the trainer asks for) leaves the pixels as they are: the train and eval
steps normalise them on the device (`jia_jax/normalize.py`), which halves the bytes of bf16 and
takes the per-pixel arithmetic off the host CPU; any float dtype normalises here.
"""

import functools
import gc
import io
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import grain
import ml_dtypes  # noqa: F401  registers np.dtype('bfloat16')
import numpy as np
import PIL.Image
import tensorflow_datasets as tfds

from jia_jax import bad_records, console, crop_windows, example_records, image_folder, normalize

IMAGENET_MEAN, IMAGENET_STD = normalize.IMAGENET_MEAN, normalize.IMAGENET_STD
T = TypeVar("T")
# Arrays a worker process hands over below this size travel pickled, not in shared memory. grain's
# default (0) gives every array of every batch a segment of its own, which this process maps and a
# thread of grain's unmaps and unlinks: 8 a batch on the GPU path, where 7 hold a few KiB at most.
SHARED_MEMORY_MIN_BYTES = 64 * 1024


class DatasetNotPreparedError(FileNotFoundError):
    """The dataset is not prepared in `data_dir` in a format this module reads."""


class DatasetSizes(NamedTuple):
    num_classes: int
    num_train: int
    num_eval: int
    class_names: tuple[str, ...]


def _prepare_hint(name: str, data_dir: str) -> str:
    """One line: the commands that prepare `name` in `data_dir`, or convert a TFRecord copy."""
    manual = (
        " --manual_dir=DIR_WITH_ILSVRC2012_img_train.tar_AND_ILSVRC2012_img_val.tar"
        if name.startswith("imagenet2012")
        else ""
    )
    base = name.split("/")[0].split(":")[0]
    return (
        f"Prepare it once with `tfds build {name} --data_dir={data_dir}{manual} "
        "--file_format=array_record` (needs `pip install tensorflow-cpu`; training does not), "
        f"convert a TFRecord copy with `tfds convert_format --dataset_dir={data_dir}/{base} "
        "--out_file_format=array_record`, or point --config.data.data_dir at the prepared copy "
        "(docs/input_pipeline.md)."
    )


def _builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
    """The builder of a prepared ArrayRecord dataset, or `DatasetNotPreparedError`.

    Without `data_dir` it is tfds's default ($TFDS_DATA_DIR or ~/tensorflow_datasets), named so
    that the error and the commands it suggests name the directory looked in.
    """
    where = f"{data_dir!r} (--config.data.data_dir)"
    if data_dir is None:
        data_dir = tfds.core.constants.DATA_DIR
        where = f"{data_dir!r} (tfds's default; set --config.data.data_dir to where it is)"
    try:
        # Of a dataset not prepared tfds first warns about the folder it did not find ("Variant
        # folder ... has no dataset_info.json"); the error below says so and what to do.
        with console.without_logs_from(tfds):
            builder = tfds.builder(name, data_dir=data_dir, try_gcs=False)
            prepared = builder.is_prepared()
    except tfds.core.DatasetNotFoundError as e:
        raise DatasetNotPreparedError(
            f"Dataset {name!r} (--config.data.name) is neither a tfds dataset nor prepared in "
            f"{where}.\n{_prepare_hint(name, data_dir)}"
        ) from e
    if not prepared:
        raise DatasetNotPreparedError(
            f"Dataset {name!r} is not prepared in {where}: no {builder.data_path}.\n"
            + _prepare_hint(name, data_dir)
        )
    file_format = builder.info.file_format
    if file_format != tfds.core.FileFormat.ARRAY_RECORD:
        raise DatasetNotPreparedError(
            f"Dataset {name!r} in {where} is stored as {file_format.value}; this input "
            "pipeline reads by index and needs ArrayRecord.\n" + _prepare_hint(name, data_dir)
        )
    features = dict(builder.info.features.items())
    needed = {"image": tfds.features.Image, "label": tfds.features.ClassLabel}
    if any(not isinstance(features.get(key), kind) for key, kind in needed.items()):
        raise ValueError(
            f"Dataset {name!r} has features {list(features)}; an `image` (Image) and a `label` "
            "(ClassLabel) feature are needed."
        )
    return builder


def dataset_info(
    name: str, data_dir: str | None, train_split: str = "train", eval_split: str = "validation"
) -> DatasetSizes:
    """Classes and split sizes of a prepared dataset, or of an image folder.

    Args:
      name: tfds name, e.g. "imagenet2012" (optionally "name/config:version"), or
        "image_folder" (jia_jax/image_folder.py).
      data_dir: tfds data directory the dataset was prepared in (None: tfds's default), or the
        image folder.
      train_split: train split, any tfds split string (e.g. "train[:99%]"), or a folder name.
      eval_split: eval split.

    Returns:
      (num_classes, num_train, num_eval, class_names).

    Raises:
      DatasetNotPreparedError: the dataset is missing or not in ArrayRecord format.
      FileNotFoundError: the image folder or one of its splits is missing.
      ValueError: the dataset has no "image" (Image) or no "label" (ClassLabel) feature.
    """
    if name == image_folder.NAME:
        folder = image_folder.open_folder(data_dir)
        folder.check_splits(train_split=train_split, eval_split=eval_split)
        return DatasetSizes(
            num_classes=len(folder.class_names),
            num_train=len(folder.records(train_split)),
            num_eval=len(folder.records(eval_split)),
            class_names=folder.class_names,
        )
    info = _builder(name, data_dir).info
    check_features(name, info.features)
    return DatasetSizes(
        num_classes=info.features["label"].num_classes,
        num_train=info.splits[train_split].num_examples,
        num_eval=info.splits[eval_split].num_examples,
        class_names=tuple(info.features["label"].names),
    )


def check_features(name: str, features: tfds.features.FeaturesDict) -> None:
    """Raises `ValueError` unless `features` has the two the input reads: "image" (an Image) and
    "label" (a ClassLabel)."""
    wanted = {"image": tfds.features.Image, "label": tfds.features.ClassLabel}
    wrong = [f"{key!r} ({kind.__name__})" for key, kind in wanted.items()
             if key not in features.keys() or not isinstance(features[key], kind)]
    if wrong:
        raise ValueError(
            f"Dataset {name!r} lacks the feature {' and '.join(wrong)} that jia_jax trains on; its "
            f"features are {sorted(features.keys())}. Prepare an image classification dataset "
            "with an 'image' and a 'label' feature, or use data.name='image_folder'."
        )


class ProcessPart(NamedTuple):
    """This process's part of a split: the records (images left encoded) and where they are."""

    source: Sequence[dict[str, Any]]
    locate: Callable[[int], tuple[str, int]]


def process_part(
    name: str,
    data_dir: str | None,
    split: str,
    process_index: int,
    process_count: int,
    *,
    drop_remainder: bool,
) -> ProcessPart:
    """This process's contiguous, disjoint part of `split`, its shards checked whole.

    Raises:
      DatasetNotPreparedError: the dataset is missing or not in ArrayRecord format.
      bad_records.CorruptDatasetError: a shard of the part is damaged.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count}).")
    if name == image_folder.NAME:
        records = image_folder.open_folder(data_dir).records(split)
        part = records.part(process_index, process_count, drop_remainder=drop_remainder)
        return ProcessPart(part, part.locate)
    builder = _builder(name, data_dir)
    sub_split = tfds.split_for_jax_process(
        split,
        process_index=process_index,
        process_count=process_count,
        drop_remainder=drop_remainder,
    )
    files = builder.info.splits[sub_split].file_instructions
    bad_records.check_shards(files)
    raw = builder.as_data_source(
        split=sub_split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
    )
    return ProcessPart(example_records.ExampleRecords(raw), bad_records.RecordLocator(files))


def read_record(source: Sequence[dict[str, Any]], index: int) -> tuple[bytes, np.int32]:
    """Record `index` as (encoded image bytes, label); raises if it is damaged."""
    example = source[index]
    if not example["image"]:
        # What a shard cut short yields past its end, with label 0.
        raise ValueError("the record holds no image bytes")
    return example["image"], np.int32(example["label"])


def _read(source: Sequence[dict[str, Any]], index: int) -> tuple[PIL.Image.Image, np.int32]:
    """Record `index` decoded; raises if it is damaged (see jia_jax/bad_records.py)."""
    encoded, label = read_record(source, index)
    return _decode_rgb(encoded), label


def _decode_rgb(encoded: bytes) -> PIL.Image.Image:
    image = PIL.Image.open(io.BytesIO(encoded))
    image.load()  # decode now, so that bad bytes fail here and not inside the crop
    # Grey-scale and CMYK JPEGs exist in ImageNet; the model wants three channels.
    return image if image.mode == "RGB" else image.convert("RGB")


def eval_pixels(image: PIL.Image.Image, image_size: int) -> np.ndarray:
    """The uint8 RGB pixels [image_size, image_size, 3] that evaluation sees of `image`: its
    centre crop (`crop_windows.eval_crop_box`), resized bilinearly."""
    image = image if image.mode == "RGB" else image.convert("RGB")
    box = crop_windows.eval_crop_box(*image.size)
    return np.asarray(image.resize((image_size, image_size), PIL.Image.BILINEAR, box=box))


def train_example(
    index: int, rng: np.random.Generator, *, source: Sequence[dict[str, Any]], image_size: int
) -> dict[str, np.ndarray]:
    """Record `index` augmented, or the next readable record if it is damaged."""
    skipped, (image, label) = bad_records.first_readable(
        functools.partial(_read, source), index, len(source)
    )
    box, flip = crop_windows.train_window(rng, *image.size)
    # Resizing only the box is crop-then-resize in one pass, without copying the crop.
    pixels = np.asarray(image.resize((image_size, image_size), PIL.Image.BILINEAR, box=box))
    if flip:
        pixels = pixels[:, ::-1]
    return {
        "image": pixels,
        "label": label,
        bad_records.SKIPPED: np.int32(skipped),
        bad_records.SKIPPED_FROM: np.int64(index),
    }


def eval_entry(
    index: int,
    source: Sequence[dict[str, Any]],
    blank: dict[str, np.ndarray],
    read: Callable[[Sequence[dict[str, Any]], int], T],
    finish: Callable[[T], dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """Entry `index` of an eval pass over `source`: `finish(read(source, index))` with mask 1;
    `blank` with label 0 and mask 0 past the end (padding) or where the record does not read
    (left out; the counter names it)."""
    padding = {
        **blank,
        "label": np.int32(0),
        "mask": np.float32(0),
        bad_records.SKIPPED: np.int32(0),
        bad_records.SKIPPED_FROM: np.int64(index),
    }
    if index >= len(source):
        return padding
    try:
        record = read(source, index)
    except Exception:  # noqa: BLE001  a damaged record is left out; the counter names it
        return {**padding, bad_records.SKIPPED: np.int32(1)}
    return {**padding, **finish(record), "mask": np.float32(1)}


def eval_example(
    index: int, *, source: Sequence[dict[str, Any]], image_size: int
) -> dict[str, np.ndarray]:
    """Example `index` of `source`, centre-cropped; mask 0 past its end or where it is damaged."""

    def crop(record: tuple[PIL.Image.Image, np.int32]) -> dict[str, np.ndarray]:
        image, label = record
        return {"image": eval_pixels(image, image_size), "label": label}

    blank = {"image": np.zeros((image_size, image_size, 3), np.uint8)}
    return eval_entry(index, source, blank, _read, crop)


def train_examples(
    part: ProcessPart, seed: int, process_index: int, augment: Callable[..., T]
) -> grain.MapDataset:
    """The endless, epoch-reshuffled examples of this process: `augment(index, rng)` at each
    position, `rng` a function of (seed, process, position).

    Both input paths build their examples here with their own `augment`, so position p draws
    the same record and the same random numbers on either.
    """
    # Distinct per-process seeds keep hosts from drawing the same crops for their example i.
    process_seed = int(np.random.SeedSequence([seed, process_index]).generate_state(1)[0])
    # Indices, not records, are shuffled: a damaged record can then be replaced inside the map.
    return (
        grain.MapDataset.range(len(part.source))
        .seed(process_seed)
        .shuffle()
        .repeat()
        .random_map(augment)
    )


def check_train_part(part: ProcessPart, local_batch: int, split: str, process_index: int) -> None:
    """Raises `ValueError` if the process's part holds less than one batch."""
    if len(part.source) < local_batch:
        raise ValueError(
            f"Process {process_index} has {len(part.source)} examples of {split!r}, fewer than "
            f"one batch of {local_batch}."
        )


def eval_batch_count(
    name: str, data_dir: str | None, split: str, process_count: int, local_batch: int
) -> int:
    """Eval batches per process: enough for the largest process's part, the same on all."""
    if name == image_folder.NAME:
        largest_part = math.ceil(len(image_folder.open_folder(data_dir).records(split)) / process_count)
    else:
        splits = _builder(name, data_dir).info.splits
        largest_part = max(
            splits[tfds.split_for_jax_process(split, process_index=p, process_count=process_count)]
            .num_examples
            for p in range(process_count)
        )
    return math.ceil(largest_part / local_batch)


def _normalized(batches: grain.MapDataset, dtype: np.dtype) -> grain.MapDataset:
    """`batches` normalised into `dtype`; uint8 leaves them as they are (the train and eval
    steps normalise on the device). Then batching is the last step, which lets grain's worker
    processes build each batch directly in shared memory instead of pickling it to the trainer.
    """
    if dtype == np.uint8:
        return batches
    return batches.map(functools.partial(_normalize, dtype=dtype))


def _normalize(batch: dict[str, np.ndarray], *, dtype: np.dtype) -> dict[str, np.ndarray]:
    """(image - mean) / std of a stacked uint8 batch, computed in float32, cast to `dtype`."""
    pixels = batch["image"]
    # Broadcasting over rows of width*3 values instead of a trailing axis of 3 keeps numpy's inner
    # loop long: about 5x faster, which matters as this pass is a sizeable part of the JPEG decode.
    row = pixels.shape[-2] * pixels.shape[-1]
    image = pixels.reshape(-1, row).astype(np.float32)
    image *= np.tile(1 / IMAGENET_STD, row // 3)
    image += np.tile(-IMAGENET_MEAN / IMAGENET_STD, row // 3)
    return {**batch, "image": image.reshape(pixels.shape).astype(dtype, copy=False)}


def host_iterator(
    batches: grain.MapDataset, num_threads: int, num_workers: int
) -> Iterator[dict[str, np.ndarray]]:
    """Iterates `batches` with `num_threads` threads in each of `num_workers` worker processes
    (0: in this process)."""
    # Elements are whole batches: a few in flight per thread keep the loader ahead of the step
    # without holding hundreds of batches in memory (grain's default buffer is 500 elements).
    read_options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=2 * num_threads)
    dataset = batches.to_iter_dataset(read_options)
    if num_workers > 0:
        options = grain.experimental.DatasetOptions(min_shm_size=SHARED_MEMORY_MIN_BYTES)
        dataset = grain.experimental.WithOptionsIterDataset(dataset, options)
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return _collected_at_end(iter(dataset))


def _collected_at_end(items: Iterator[T]) -> Iterator[T]:
    """`items`, then a garbage collection once they end. grain's prefetch thread keeps the last
    element of a finite stream in a reference cycle (the StopIteration it hands over holds, in
    its traceback, the frame that fetched the element), which only the collector frees: a batch
    in shared memory outlived the eval pass, and Python warned at exit of a "leaked
    shared_memory" object."""
    yield from items
    gc.collect()


def bad_record_counter(part: ProcessPart, max_bad_records: int) -> bad_records.BadRecordCounter:
    """The consumer-side counter of the part's bad records (one per process, after any
    workers), which names each by decoding it again."""
    return bad_records.BadRecordCounter(
        functools.partial(_read, part.source), len(part.source), part.locate, max_bad_records
    )


def train_batches(
    name: str,
    *,
    data_dir: str | None,
    split: str,
    image_size: int,
    local_batch: int,
    seed: int,
    start_step: int,
    process_index: int,
    process_count: int,
    image_dtype: str | np.dtype = np.float32,
    num_threads: int = 4,
    num_workers: int = 0,
    max_bad_records: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless train batches of this process, starting at `start_step`.

    The process reads its own contiguous 1/process_count of `split` (the remainder is dropped so
    every process has the same epoch length) and reshuffles it every epoch. Batch k is a pure
    function of (seed, process_index, process_count, k, local_batch): the stream from
    `start_step=k` equals the tail of the stream from 0, and resuming costs no extra reads. Thread
    and worker counts change only the speed, never the batches.

    Args:
      name: tfds dataset name.
      data_dir: tfds data directory it was prepared in (ArrayRecord format; None: tfds's default).
      split: tfds split string, e.g. "train".
      image_size: output height and width.
      local_batch: examples per batch on this process (global batch / process_count).
      seed: data seed; shuffling and augmentation derive from it and from process_index.
      start_step: index of the first batch to yield.
      process_index: this process, in [0, process_count).
      process_count: number of processes reading the dataset.
      image_dtype: dtype of the images, e.g. "bfloat16": the model's compute dtype.
      num_threads: threads decoding batches in each reading process; each holds up to two
        finished batches.
      num_workers: worker processes reading batches; 0 reads in this process. Threads alone top
        out near 1,000 images/s (the GIL); to feed a GPU give about one worker per core. Workers
        read absl flags, so the program must have parsed them (`absl.app.run` does).
      max_bad_records: unreadable records to replace (each by the next readable one, the same
        way every time) before stopping; see jia_jax/bad_records.py.

    Yields:
      {"image": image_dtype [local_batch, image_size, image_size, 3] normalised,
       "label": int32 [local_batch]}.

    Raises:
      DatasetNotPreparedError: the dataset is missing or not in ArrayRecord format.
      bad_records.CorruptDatasetError: a shard is damaged (at once), or more than
        `max_bad_records` records are (when the batch holding the next one is reached).
    """
    part = process_part(name, data_dir, split, process_index, process_count, drop_remainder=True)
    check_train_part(part, local_batch, split, process_index)
    augment = functools.partial(train_example, source=part.source, image_size=image_size)
    # Slicing after batching skips whole batches by index arithmetic, without reading them.
    batches = train_examples(part, seed, process_index, augment).batch(
        local_batch, drop_remainder=True
    )[start_step:]
    batches = _normalized(batches, np.dtype(image_dtype))
    return bad_record_counter(part, max_bad_records)(
        host_iterator(batches, num_threads, num_workers)
    )


def eval_batches(
    name: str,
    *,
    data_dir: str | None,
    split: str,
    image_size: int,
    local_batch: int,
    process_index: int,
    process_count: int,
    image_dtype: str | np.dtype = np.float32,
    num_threads: int = 4,
    num_workers: int = 0,
    max_bad_records: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """One pass over this process's part of `split`, padded to whole batches.

    Every process yields the same number of batches (enough for the largest part), so all of them
    take part in every eval step; padding examples have mask 0, so each example of `split` counts
    exactly once over all processes.

    Args:
      name: tfds dataset name.
      data_dir: tfds data directory it was prepared in (ArrayRecord format; None: tfds's default).
      split: tfds split string, e.g. "validation".
      image_size: output height and width.
      local_batch: examples per batch on this process.
      process_index: this process, in [0, process_count).
      process_count: number of processes reading the dataset.
      image_dtype: dtype of the images, e.g. "bfloat16": the model's compute dtype.
      num_threads: threads decoding batches in each reading process.
      num_workers: worker processes reading batches; 0 reads in this process.
      max_bad_records: unreadable records to leave out (mask 0) before stopping.

    Yields:
      {"image": image_dtype [local_batch, image_size, image_size, 3] normalised,
       "label": int32 [local_batch], "mask": float32 [local_batch], 1 real / 0 padding}.

    Raises:
      DatasetNotPreparedError: the dataset is missing or not in ArrayRecord format.
      bad_records.CorruptDatasetError: a shard is damaged (at once), or more than
        `max_bad_records` records are (when the batch holding the next one is reached).
    """
    part = process_part(name, data_dir, split, process_index, process_count, drop_remainder=False)
    num_batches = eval_batch_count(name, data_dir, split, process_count, local_batch)
    batches = (
        grain.MapDataset.range(num_batches * local_batch)
        .map(functools.partial(eval_example, source=part.source, image_size=image_size))
        .batch(local_batch)
    )
    batches = _normalized(batches, np.dtype(image_dtype))
    return bad_record_counter(part, max_bad_records)(
        host_iterator(batches, num_threads, num_workers)
    )
