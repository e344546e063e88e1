"""Input: per-process host batches assembled into global `jax.Array`s on the batch sharding.

Datasets:
  * `synthetic`: ImageNet-shaped random data made on the devices (throughput runs, no input cost).
  * `digits`: scikit-learn's bundled 8x8 handwritten digits, a real dataset that needs no
    download, upsampled to `data.image_size`; fixed train/test split. The embedded default.
  * `image_folder`: a folder of <split>/<class>/<image> files in `data.data_dir`
    (`jia_jax.image_folder`), read like a tfds dataset.
  * anything else: a tfds image-classification dataset prepared in `data.data_dir`
    (`jia_jax.tfds_input`).

Every train stream is a pure function of (seed, step): resuming at step k yields exactly the
batches an uninterrupted run sees from k on. Each process materialises only its share.

A tfds dataset's JPEGs are decoded on the CPU (Pillow, `jia_jax.tfds_input`) or on the GPU
(nvImageCodec, `jia_jax.gpu_input`), as `data.decode` says: "cpu", "gpu", or "auto" (the GPU
where JAX runs on GPUs and nvImageCodec is installed, else the CPU). Both give the same examples
with the same crop windows; docs/input_pipeline.md compares them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import itertools
import os
import pathlib
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from absl import logging

from jia_jax import gpu_decode, stage_clock
from jia_jax import mesh as mesh_lib

Batch = dict[str, jax.Array]

DIGITS_TEST_SIZE = 360
DECODE_CHOICES = ("auto", "cpu", "gpu")
# The datasets made in memory: no JPEGs to decode, whatever `data.decode` says.
NO_JPEGS = ("synthetic", "digits")
# Mean/std of the digits pixel values (0..16) over the whole set; fixed so the split does not leak.
_DIGITS_MEAN, _DIGITS_STD = 4.88, 6.02


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    num_classes: int
    num_train: int
    num_eval: int
    channels: int
    class_names: tuple[str, ...]  # label i's name


@dataclasses.dataclass(frozen=True)
class Input:
    """What the trainer needs from the data side."""

    info: DatasetInfo
    train: Callable[[int], Iterator[Batch]]  # start_step -> global train batches
    eval: Callable[[], Iterator[Batch]] | None  # one pass with a `mask`; None for synthetic
    # Where the train stream's input thread waits per batch (the GPU path's), if it says.
    stages: stage_clock.StageClock | None = None


def create_input(
    data: ml_collections.ConfigDict,
    global_batch: int,
    eval_batch: int,
    mesh: Mesh,
    seed: int,
) -> Input:
    """Builds the train/eval streams for `data.name` on `mesh`.

    tfds images travel as uint8 (a quarter of float32's bytes, no per-pixel work on the host);
    the train and eval steps normalise them on the device.
    """
    sharding = mesh_lib.batch_sharding(mesh)
    _check_data_config(data, global_batch, eval_batch, mesh.devices.size)
    if seed < 0:  # else a numpy error that names no field
        raise ValueError(f"seed={seed} must be >= 0.")
    if data.name in NO_JPEGS and data.decode == "gpu":
        # Asked for by name, so say that it does nothing here rather than drop it silently.
        logging.warning(
            "data.decode='gpu' is ignored: data.name=%r has no JPEGs to decode (it applies to "
            "prepared tfds datasets).", data.name,
        )
    if data.name == "synthetic":
        return _synthetic_input(data, global_batch, sharding, seed)
    if data.name == "digits":
        return _digits_input(data, global_batch, eval_batch, sharding, seed)
    return _tfds_input(data, global_batch, eval_batch, sharding, seed)


def _check_data_config(
    data: ml_collections.ConfigDict, global_batch: int, eval_batch: int, num_devices: int
) -> None:
    """Raises ValueError naming the field to fix where the data config or a batch size cannot
    work on `num_devices` devices."""
    if data.image_size < 1:
        raise ValueError(f"data.image_size={data.image_size} must be positive.")
    if data.decode not in DECODE_CHOICES:
        raise ValueError(f"data.decode={data.decode!r} is not one of {DECODE_CHOICES}.")
    if data.num_workers < 0:  # else read as 0, silently
        raise ValueError(
            f"data.num_workers={data.num_workers} must be >= 0 (0 reads in the training process)."
        )
    for field, size in (("global_batch_size", global_batch), ("eval_batch_size", eval_batch)):
        if size <= 0:
            raise ValueError(f"{field}={size} must be positive (a multiple of {num_devices}).")
        if size % num_devices:
            raise ValueError(
                f"{field}={size} must be divisible by the device count ({num_devices})."
            )


def _synthetic_input(
    data: ml_collections.ConfigDict,
    global_batch: int,
    sharding: jax.sharding.NamedSharding,
    seed: int,
) -> Input:
    """One ImageNet-shaped random batch made on the devices, repeated: no input cost."""
    info = DatasetInfo(
        num_classes=data.num_classes,
        num_train=1_281_167,
        num_eval=0,
        channels=3,
        class_names=tuple(str(i) for i in range(data.num_classes)),
    )
    shape = (global_batch, data.image_size, data.image_size, 3)

    def synthetic_train(start_step: int) -> Iterator[Batch]:
        del start_step  # every step sees the same batch
        batch = _synthetic_batch(shape, info.num_classes, seed, sharding)
        return itertools.repeat(batch)

    return Input(info, synthetic_train, None)


def _digits_input(
    data: ml_collections.ConfigDict,
    global_batch: int,
    eval_batch: int,
    sharding: jax.sharding.NamedSharding,
    seed: int,
) -> Input:
    """scikit-learn's bundled digits, each process reading its share of every batch."""
    process, processes = jax.process_index(), jax.process_count()
    train_x, train_y = digits_split("train", data.image_size)
    test_x, test_y = digits_split("test", data.image_size)
    info = DatasetInfo(
        num_classes=10,
        num_train=len(train_y),
        num_eval=len(test_y),
        channels=1,
        class_names=tuple(str(i) for i in range(10)),
    )
    if global_batch > info.num_train:
        raise ValueError(
            f"global_batch_size={global_batch} exceeds the digits train set "
            f"({info.num_train} examples)."
        )

    def digits_train(start_step: int) -> Iterator[Batch]:
        local = _epoch_shuffled_batches(
            train_x, train_y, global_batch, seed, start_step, process, processes
        )
        return prefetch(global_batches(local, sharding))

    def digits_eval() -> Iterator[Batch]:
        local = _padded_batches(test_x, test_y, eval_batch, process, processes)
        return global_batches(local, sharding)

    return Input(info, digits_train, digits_eval)


def resolve_decode(choice: str) -> str:
    """"cpu" or "gpu": where a tfds dataset's JPEGs are decoded for `data.decode=choice`.

    Raises:
      ValueError: "gpu" where it cannot run (no GPU backend, no nvImageCodec, or XLA set to
        reserve the memory its buffers need).
    """
    if choice == "cpu":
        return "cpu"
    if not gpu_decode.available():
        if choice == "gpu":
            raise ValueError(
                f"data.decode='gpu' needs JAX on GPUs (here: {jax.default_backend()}) and "
                f"nvImageCodec (installed: {gpu_decode.library_installed()}; "
                "pip install -e '.[gpu]'); or set --config.data.decode=cpu."
            )
        return "cpu"
    try:
        gpu_decode.check_memory_fraction(os.environ)
    except ValueError as e:
        if choice == "gpu":
            raise
        logging.warning("Decoding on the CPU: %s", e)
        return "cpu"
    # What jia_jax.main would have set before CUDA started, had this process come through it.
    for name, value in gpu_decode.cuda_environment(choice, os.environ).items():
        logging.warning(
            "%s is not set: the GPU decoder may wait behind queued train steps, many times "
            "slower; set %s=%s before JAX starts.", name, name, value
        )
    return "gpu"


def _tfds_input(
    data: ml_collections.ConfigDict,
    global_batch: int,
    eval_batch: int,
    sharding: jax.sharding.NamedSharding,
    seed: int,
) -> Input:
    """The streams of a prepared tfds dataset, decoded where `data.decode` says."""
    from jia_jax import tfds_input  # imported lazily: pulls in grain and tfds

    sizes = tfds_input.dataset_info(data.name, data.data_dir, data.train_split, data.eval_split)
    info = DatasetInfo(
        num_classes=sizes.num_classes,
        num_train=sizes.num_train,
        num_eval=sizes.num_eval,
        channels=3,
        class_names=sizes.class_names,
    )
    if resolve_decode(data.decode) == "gpu":
        from jia_jax import gpu_input  # imported lazily: it builds decoders on the devices

        try:
            streams = gpu_input.GpuStreams.create(data, sharding, global_batch, eval_batch, seed)
            logging.info("Decoding %s's JPEGs on the GPU.", data.name)
            return Input(info, streams.train, streams.eval, streams.clock)
        except gpu_decode.DecoderUnavailableError as e:
            if data.decode == "gpu":
                raise ValueError(str(e)) from e
            logging.warning("Decoding on the CPU: %s", e)
    logging.info("Decoding %s's JPEGs on the CPU.", data.name)
    process, processes = jax.process_index(), jax.process_count()

    def tfds_train(start_step: int) -> Iterator[Batch]:
        local = tfds_input.train_batches(
            data.name,
            data_dir=data.data_dir,
            split=data.train_split,
            image_size=data.image_size,
            local_batch=global_batch // processes,
            seed=seed,
            start_step=start_step,
            process_index=process,
            process_count=processes,
            image_dtype="uint8",
            num_workers=data.num_workers,
            max_bad_records=data.max_bad_records,
        )
        return prefetch(global_batches(local, sharding))

    def tfds_eval() -> Iterator[Batch]:
        local = tfds_input.eval_batches(
            data.name,
            data_dir=data.data_dir,
            split=data.eval_split,
            image_size=data.image_size,
            local_batch=eval_batch // processes,
            process_index=process,
            process_count=processes,
            image_dtype="uint8",
            num_workers=data.num_workers,
            max_bad_records=data.max_bad_records,
        )
        return global_batches(local, sharding)

    return Input(info, tfds_train, tfds_eval)


def global_batches(
    local: Iterator[dict[str, np.ndarray]], sharding: jax.sharding.NamedSharding
) -> Iterator[Batch]:
    """Turns each process's share of a batch into global arrays sharded over the batch axes."""
    for batch in local:
        yield {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def prefetch(batches: Iterator[Batch], depth: int = 2) -> Iterator[Batch]:
    """Keeps `depth` batches' host-to-device copies in flight ahead of the consumer."""
    queue = collections.deque(itertools.islice(batches, depth))
    while queue:
        yield queue.popleft()
        queue.extend(itertools.islice(batches, 1))


def _synthetic_batch(
    shape: tuple[int, ...], num_classes: int, seed: int, sharding: jax.sharding.NamedSharding
) -> Batch:
    @jax.jit
    def make(key):
        k_img, k_lab = jax.random.split(key)
        # bf16 halves the memory of a large per-device batch; the model casts to its compute dtype.
        images = jax.random.normal(k_img, shape, jnp.bfloat16)
        labels = jax.random.randint(k_lab, shape[:1], 0, num_classes, jnp.int32)
        return {
            "image": jax.lax.with_sharding_constraint(images, sharding),
            "label": jax.lax.with_sharding_constraint(labels, sharding),
        }

    return make(jax.random.key(seed))


def digits_split(split: str, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The digits `split` ("train" or "test") as the trainer sees it: images [N, S, S, 1]
    float32, normalised, and int32 labels."""
    if split not in ("train", "test"):
        raise ValueError(f"digits has the splits 'train' and 'test', not {split!r}.")
    images, labels = _load_digits(image_size)
    rows = slice(DIGITS_TEST_SIZE, None) if split == "train" else slice(DIGITS_TEST_SIZE)
    return images[rows], labels[rows]


@functools.cache
def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits as `load_digits()` gives them: images [1797, 8, 8] float64
    (0 to 16) and integer labels.

    Read straight from the file scikit-learn ships where it is found: importing scikit-learn (and
    SciPy with it) takes longer than a digits run's first steps, ~2.4 s of every run's start-up on
    a 2-core machine. Elsewhere scikit-learn's own reader.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = spec and pathlib.Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not (path and path.is_file()):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images, labels = digits.images, digits.target
    else:  # its rows are an image's 64 pixels, then its label, as load_digits reads them
        rows = np.loadtxt(path, delimiter=",")
        images, labels = rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)
    for array in (images, labels):  # shared by every caller
        array.setflags(write=False)
    return images, labels


def _load_digits(image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as normalised [N, S, S, 1] float32 images in a fixed shuffled order."""
    digit_images, digit_labels = bundled_digits()
    order = np.random.default_rng(0).permutation(len(digit_labels))
    images = digit_images[order].astype(np.float32)
    if image_size % 8:
        raise ValueError(f"data.image_size={image_size} must be a multiple of 8 for digits.")
    factor = image_size // 8
    images = np.repeat(np.repeat(images, factor, axis=1), factor, axis=2)  # nearest upsampling
    images = (images - _DIGITS_MEAN) / _DIGITS_STD
    return images[..., None], digit_labels[order].astype(np.int32)


def _epoch_shuffled_batches(
    x: np.ndarray,
    y: np.ndarray,
    global_batch: int,
    seed: int,
    start_step: int,
    process: int,
    processes: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless per-epoch reshuffled batches (remainder dropped); this process's rows only."""
    steps_per_epoch = len(y) // global_batch
    local = global_batch // processes
    for step in itertools.count(start_step):
        epoch, index = divmod(step, steps_per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(y))
        rows = order[index * global_batch : (index + 1) * global_batch]
        rows = rows[process * local : (process + 1) * local]
        yield {"image": x[rows], "label": y[rows]}


def _padded_batches(
    x: np.ndarray, y: np.ndarray, global_batch: int, process: int, processes: int
) -> Iterator[dict[str, np.ndarray]]:
    """One pass in order; the last batch is padded and `mask` marks the real examples."""
    local = global_batch // processes
    for start in range(0, len(y), global_batch):
        rows = np.arange(start, start + global_batch)[process * local : (process + 1) * local]
        mask = rows < len(y)
        rows = np.where(mask, rows, 0)
        yield {"image": x[rows], "label": y[rows], "mask": mask.astype(np.float32)}
