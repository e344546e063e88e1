r"""Measures the train input pipeline in images/s per CPU core on generated JPEGs.

Writes a tfds dataset of random 500x375 JPEGs (about 100 KB each, close to the ImageNet average;
no download), then times the train pipeline of `jia_jax.tfds_input` (grain + Pillow) and, where
TensorFlow is installed, the equivalent tf.data pipeline (tfds TFRecord + `decode_and_crop_jpeg`).
Each measurement runs in a fresh process pinned to the first `cores` CPUs. Prints a table and
writes JSON. Besides wall-clock images/s it reports images per CPU-second used by the loader and
its worker processes: the per-core cost, which holds even when other jobs share the cores.

Run from the repository root (the tf.data rows need `pip install tensorflow-cpu`):

  python -m scripts.bench.input --data_dir=/tmp/jia_bench_data --out=/tmp/bench_input.json
"""

import argparse
import io
import multiprocessing
import os
import platform
import sys
import time
from queue import Empty

import numpy as np
import PIL.Image
import psutil
import tensorflow_datasets as tfds
from absl import flags

from jia_jax import tfds_input
from scripts.bench import harness

_NAME = "jia_bench_jpeg"
WIDTH, HEIGHT = 500, 375
_NUM_CLASSES = 1000
# What the grain pipeline hands the trainer: host-bf16 images normalised on the host (the pipeline
# before uint8), or host-uint8 pixels that the train step normalises on the device (the trainer's).
# Both are resized on the host; a device-side resize was tried and lost end to end
# (docs/input_pipeline.md).
OUTPUTS = {"host-bf16": "bfloat16", "host-uint8": "uint8"}
LOADERS = ["grain processes", "grain threads", "tf.data"]


class JiaBenchJpeg(tfds.core.GeneratorBasedBuilder):
    """Random smooth-plus-noise JPEGs (the noise sets the file size, like natural texture)."""

    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, num_images: int = 2000, **kwargs):
        self._num_images = num_images
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
                    "label": tfds.features.ClassLabel(num_classes=_NUM_CLASSES),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        rng = np.random.default_rng(0)
        for i in range(self._num_images):
            image = jpeg(rng)
            yield i, {"image": image, "label": int(rng.integers(_NUM_CLASSES))}


def jpeg(rng: np.random.Generator) -> bytes:
    """One generated photograph-like JPEG drawn from `rng`: WIDTH x HEIGHT of smooth colour plus
    noise (the noise sets the file size, like natural texture), quality 90."""
    coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    smooth = PIL.Image.fromarray(coarse).resize((WIDTH, HEIGHT), PIL.Image.BICUBIC)
    noisy = np.asarray(smooth, np.float32) + rng.normal(0, 20, (HEIGHT, WIDTH, 3))
    encoded = io.BytesIO()
    PIL.Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(
        encoded, format="JPEG", quality=90
    )
    return encoded.getvalue()


def prepare(data_dir: str, num_images: int, file_format: str) -> dict[str, float]:
    """Writes the dataset in `data_dir/file_format` unless present; returns its size facts."""
    builder = JiaBenchJpeg(num_images=num_images, data_dir=os.path.join(data_dir, file_format))
    if not builder.is_prepared():
        builder.download_and_prepare(file_format=file_format)
    num_bytes = sum(os.path.getsize(f) for f in builder.data_path.glob(f"*{file_format}*"))
    num_examples = builder.info.splits["train"].num_examples
    return {"images": num_examples, "mean_kb": num_bytes / num_examples / 1e3}


def _tfdata_batches(data_dir: str, batch: int, image_size: int, image_dtype: str, cores: int):
    """The usual tfds + tf.data ResNet train pipeline, for comparison."""
    import tensorflow as tf  # Only this comparison needs TensorFlow.

    mean = tf.constant(tfds_input.IMAGENET_MEAN)
    std = tf.constant(tfds_input.IMAGENET_STD)

    def preprocess(example):
        shape = tf.image.extract_jpeg_shape(example["image"])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.zeros([1, 0, 4]),
            area_range=(0.08, 1.0),
            aspect_ratio_range=(3 / 4, 4 / 3),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.image.decode_and_crop_jpeg(example["image"], window, channels=3)
        image = tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True)
        image = tf.image.random_flip_left_right(image)
        image = tf.cast((image - mean) / std, image_dtype)
        return {"image": image, "label": tf.cast(example["label"], tf.int32)}

    builder = tfds.builder(_NAME, data_dir=os.path.join(data_dir, "tfrecord"))
    ds = builder.as_dataset(
        split="train", shuffle_files=True, decoders={"image": tfds.decode.SkipDecoding()}
    )
    options = tf.data.Options()
    options.threading.private_threadpool_size = cores
    ds = ds.with_options(options).shuffle(16 * batch).repeat()
    ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).batch(batch, drop_remainder=True)
    return ds.prefetch(2).as_numpy_iterator()


def _cpu_seconds() -> float:
    """CPU time used so far by this process and its live worker processes."""
    processes = [psutil.Process()]
    processes += processes[0].children(recursive=True)
    return sum(p.cpu_times().user + p.cpu_times().system for p in processes)


def _measure(config: dict, results: multiprocessing.Queue) -> None:
    """Puts the images/s of one configuration on `results`; runs pinned to `cores` CPUs."""
    os.sched_setaffinity(0, range(config["cores"]))
    # grain's worker processes read an absl flag; this script parses its own arguments.
    flags.FLAGS.mark_as_parsed()
    if config["loader"] == "tf.data":
        batches = _tfdata_batches(
            config["data_dir"],
            config["batch"],
            config["image_size"],
            config["image_dtype"],
            config["cores"],
        )
    else:
        batches = tfds_input.train_batches(
            _NAME,
            data_dir=os.path.join(config["data_dir"], "array_record"),
            split="train",
            image_size=config["image_size"],
            local_batch=config["batch"],
            seed=0,
            start_step=0,
            process_index=0,
            process_count=1,
            image_dtype=config["image_dtype"],
            num_threads=config["threads"],
            num_workers=config["workers"],
        )
    # Worker processes start up during the first batches, each with its own first batch.
    for _ in range(config["warmup"] + config["workers"]):
        next(batches)
    start, start_cpu = time.perf_counter(), _cpu_seconds()
    steps = 0
    while steps < 5 or time.perf_counter() - start < config["seconds"]:
        batch = next(batches)
        steps += 1
    seconds, cpu_seconds = time.perf_counter() - start, _cpu_seconds() - start_cpu
    assert batch["image"].shape == (config["batch"], config["image_size"], config["image_size"], 3)
    images = steps * config["batch"]
    results.put(
        {
            **config,
            "images_per_s": images / seconds,
            "images_per_s_per_core": images / seconds / config["cores"],
            "images_per_cpu_s": images / cpu_seconds,
        }
    )


def _has_tensorflow() -> bool:
    try:
        import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return False
    return True


def parse_args() -> argparse.Namespace:
    """The command-line arguments: dataset, rows to measure, timing, output."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="/tmp/jia_bench_data")
    parser.add_argument("--num_images", type=int, default=2000)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument(
        "--outputs",
        nargs="+",
        choices=sorted(OUTPUTS),
        default=sorted(OUTPUTS),
        help="what the grain pipeline hands the trainer (tf.data rows: bf16)",
    )
    parser.add_argument(
        "--loaders", nargs="+", choices=LOADERS, default=LOADERS, help="tf.data needs TensorFlow"
    )
    parser.add_argument("--warmup", type=int, default=3, help="batches before timing starts")
    parser.add_argument("--seconds", type=float, default=10, help="time each row this long")
    parser.add_argument("--cores", type=int, nargs="+", default=[1, os.cpu_count()])
    parser.add_argument(
        "--worker_threads", type=int, nargs="+", default=[2], help="threads per worker process"
    )
    parser.add_argument("--out", default="bench_input.json")
    return parser.parse_args()


def row_configs(args: argparse.Namespace, with_tf: bool) -> list[dict]:
    """One configuration per table row: for each core count, the grain rows of each output,
    then the tf.data row where `with_tf`."""
    configs = []
    for cores in args.cores:
        for output in args.outputs:
            grain_rows = {"output": output, "image_dtype": OUTPUTS[output]}
            if "grain threads" in args.loaders:
                configs.append(
                    {"loader": "grain threads", "cores": cores, "threads": 2 * cores, "workers": 0}
                    | grain_rows
                )
            if "grain processes" in args.loaders:
                configs += [
                    {"loader": "grain processes", "cores": cores, "threads": t, "workers": cores}
                    | grain_rows
                    for t in args.worker_threads
                ]
        if with_tf:
            configs.append(
                {"loader": "tf.data", "cores": cores, "threads": cores, "workers": 0}
                | {"output": "bf16", "image_dtype": "bfloat16"}
            )
    return configs


def measure_each(configs: list[dict], common: dict) -> list[dict]:
    """The result row of each configuration (with `common` added), each measured by `_measure`."""
    # A fresh (non-daemon, so grain may start workers) process per measurement: pinning and
    # thread pools do not leak between rows.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    results = []
    for config in configs:
        process = context.Process(target=_measure, args=({**common, **config}, queue))
        process.start()
        while process.is_alive() or not queue.empty():
            try:
                results.append(queue.get(timeout=5))
                break
            except Empty:
                pass
        process.join()
        if process.exitcode:
            raise RuntimeError(f"Measuring {config} failed with exit code {process.exitcode}.")
    return results


def print_table(dataset: dict, args: argparse.Namespace, cpu: str, results: list[dict]) -> None:
    """Prints the dataset and machine line, then one line per result row."""
    print(
        f"{dataset['images']} JPEGs of {WIDTH}x{HEIGHT}, {dataset['mean_kb']:.0f} KB mean; "
        f"batch {args.batch}, {args.image_size}px; {cpu}, "
        f"{os.cpu_count()} cores"
    )
    print(
        f"{'loader':<16} {'output':<11} {'cores':>5} {'threads':>7} {'workers':>7} {'img/s':>8} "
        f"{'img/s/core':>10} {'img/cpu-s':>9}"
    )
    for r in results:
        print(
            f"{r['loader']:<16} {r['output']:<11} {r['cores']:>5} {r['threads']:>7} "
            f"{r['workers']:>7} {r['images_per_s']:>8.0f} {r['images_per_s_per_core']:>10.0f} "
            f"{r['images_per_cpu_s']:>9.0f}"
        )


def main() -> None:
    args = parse_args()
    with_tf = "tf.data" in args.loaders and _has_tensorflow()
    dataset = prepare(args.data_dir, args.num_images, "array_record")
    if with_tf:
        prepare(args.data_dir, args.num_images, "tfrecord")
    common = {k: getattr(args, k) for k in ("data_dir", "batch", "image_size", "warmup", "seconds")}
    results = measure_each(row_configs(args, with_tf), common)

    cpu = platform.processor() or platform.machine()
    print_table(dataset, args, cpu, results)
    doc = {
        "environment": {**harness.environment(), "cpu": cpu},
        "command": " ".join(sys.argv),
        "dataset": dataset,
        "cpu_count": os.cpu_count(),
        "results": results,
    }
    harness.write_json(args.out, doc)


if __name__ == "__main__":
    main()
