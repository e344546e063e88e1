"""A tiny tfds dataset of generated JPEGs for the input tests, and ways to damage a copy of it."""

import io
import re
import shutil
from pathlib import Path

import numpy as np
import PIL.Image
import tensorflow_datasets as tfds
from array_record.python import array_record_module

from jia_jax import tfds_input

NAME = "jia_test_jpeg"
NUM_TRAIN, NUM_EVAL = 12, 7
# Example i has label i and green level GREEN_STEP * i, so an output image names its label.
GREEN_STEP = 12


def pixels(i: int) -> np.ndarray:
    """Example i's image: red ramps up left to right, green encodes the id, blue is flat."""
    width, height = 24 + 2 * i, 18 + i  # varied, non-square sizes
    image = np.zeros((height, width, 3), np.uint8)
    image[..., 0] = np.linspace(0, 255, width).astype(np.uint8)
    image[..., 1] = GREEN_STEP * i
    image[..., 2] = 128
    return image


def jpeg(image: PIL.Image.Image, **options) -> bytes:
    encoded = io.BytesIO()
    image.save(encoded, format="JPEG", quality=100, subsampling=0, **options)
    return encoded.getvalue()


class JiaTestJpeg(tfds.core.GeneratorBasedBuilder):
    """Train examples 0..11, validation 12..18, each `pixels(i)` as a JPEG."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
                    "label": tfds.features.ClassLabel(num_classes=NUM_TRAIN + NUM_EVAL),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {
            "train": self._generate_examples(range(NUM_TRAIN)),
            "validation": self._generate_examples(range(NUM_TRAIN, NUM_TRAIN + NUM_EVAL)),
        }

    def encoded(self, i: int) -> bytes:
        return jpeg(PIL.Image.fromarray(pixels(i)))

    def _generate_examples(self, ids):
        for i in ids:
            yield i, {"image": self.encoded(i), "label": i}


class JiaTestOddImages(JiaTestJpeg):
    """The same images, but what ImageNet also holds: example 3 is a CMYK JPEG, 5 a PNG stored
    as a JPEG, 7 a grey-scale JPEG, 9 a progressive JPEG, 13 (validation) a CMYK JPEG."""

    def encoded(self, i: int) -> bytes:
        image = PIL.Image.fromarray(pixels(i))
        if i in (3, 13):
            return jpeg(image.convert("CMYK"))
        if i == 5:
            encoded = io.BytesIO()
            image.save(encoded, format="PNG")
            return encoded.getvalue()
        if i == 7:
            return jpeg(image.convert("L"))
        if i == 9:
            return jpeg(image, progressive=True)
        return jpeg(image)


def train_batches(data_dir, **overrides):
    """The CPU path's train batches of the test dataset (`tfds_input.train_batches`): one
    process, 4 examples per batch, seed 0, unless `overrides` say otherwise."""
    kwargs = {
        "data_dir": data_dir,
        "split": "train",
        "local_batch": 4,
        "seed": 0,
        "start_step": 0,
        "process_index": 0,
        "process_count": 1,
        "num_threads": 2,
    }
    return tfds_input.train_batches(NAME, **{**kwargs, **overrides})


def trainer_config(data_dir, **data_fields):
    """A 2-step run of a small ResNet on the test dataset at 16 px, batch 8 on the 2x4 mesh."""
    from configs import digits  # pylint: disable=import-outside-toplevel

    config = digits.get_config()
    config.data.update(name=NAME, data_dir=data_dir, image_size=16, **data_fields)
    config.model.width = 4
    config.global_batch_size = 8
    config.eval_batch_size = 8
    config.total_steps = 2
    config.optimizer.warmup_epochs = 0.0
    return config


def prepare(builder_class: type, path: str) -> str:
    """Writes the dataset of `builder_class` under `path` (ArrayRecord); returns `path`."""
    builder_class(data_dir=path).download_and_prepare(file_format="array_record")
    return path


# Damaged datasets: a copy of a test dataset with one record or one shard broken.


def copy(data_dir, tmp_path):
    copied = tmp_path / "tfds"
    shutil.copytree(data_dir, copied)
    return str(copied)


def shard(data_dir, split, name=NAME):
    (path,) = Path(data_dir).glob(f"{name}/*/{name}-{split}.array_record-*")
    return path


def labels_in_shard_order(data_dir, split, name=NAME):
    """Record labels by position (tfds shuffles the examples when it prepares the dataset)."""
    source = tfds.builder(name, data_dir=data_dir).as_data_source(
        split=split, decoders={"image": tfds.decode.SkipDecoding()}
    )
    return [int(source[i]["label"]) for i in range(len(source))]


def rewrite_record(data_dir, split, label, change, name=NAME):
    """Rewrites the shard with `change(record bytes)` in place of `label`'s record; returns its
    position."""
    path = shard(data_dir, split, name)
    reader = array_record_module.ArrayRecordReader(str(path))
    options, records = (
        reader.writer_options_string(),
        reader.read(list(range(reader.num_records()))),
    )
    reader.close()
    position = labels_in_shard_order(data_dir, split, name).index(label)
    records[position] = change(records[position])
    writer = array_record_module.ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()
    return position


def break_jpeg(data_dir, split, label, name=NAME):
    """Makes the JPEG of `label`'s record unreadable; returns its position."""
    # Zero the JPEG start-of-image marker: same length, so the record stays a valid example.
    return rewrite_record(
        data_dir, split, label, lambda r: r.replace(b"\xff\xd8\xff", b"\x00\x00\x00", 1), name
    )


def truncate_jpeg(data_dir, split, label, name=NAME):
    """Cuts the last third off the JPEG of `label`'s record: its header still reads, its pixels
    do not decode. Returns its position."""
    builder = tfds.builder(name, data_dir=data_dir)
    source = builder.as_data_source(split=split, decoders={"image": tfds.decode.SkipDecoding()})
    position = labels_in_shard_order(data_dir, split, name).index(label)
    encoded = source[position]["image"]
    cut = {"image": encoded[: len(encoded) * 2 // 3], "label": label}
    return rewrite_record(
        data_dir, split, label, lambda _: builder.info.features.serialize_example(cut), name
    )


def break_chunk(data_dir, split, label):
    """Zeroes 3 bytes of `label`'s record in the shard file: its checksum fails. Returns its
    position."""
    path = shard(data_dir, split)
    order = labels_in_shard_order(data_dir, split)
    position = order.index(label)
    data = path.read_bytes()
    # One record per chunk, in order; each starts with a JPEG start-of-image marker, which zstd
    # leaves as is.
    starts = [m.start() for m in re.finditer(b"\xff\xd8\xff", data)]
    assert len(starts) == len(order)
    at = starts[position]
    path.write_bytes(data[:at] + bytes(3) + data[at + 3 :])
    return position
