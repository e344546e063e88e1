"""A tfds ArrayRecord split's records as ``{"image": encoded bytes, "label": int}``.

tfds's data source turns every feature of an example into numpy, generically, on each read. The
input paths want two fields, the image left encoded and the label, so the records are read as
stored and their `tf.train.Example` parsed with tfds's own message: the same two values for a
fraction of the host's time per record (docs/input_pipeline.md, "The host's time per record").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorflow_datasets.proto import tf_example_pb2


def parse(record: bytes) -> dict[str, Any]:
    """The image's bytes (empty where the example holds none) and the label of one serialized
    `tf.train.Example`.

    Raises:
      google.protobuf.message.DecodeError: `record` is not an Example.
      ValueError: the example holds no integer label.
    """
    feature = tf_example_pb2.Example.FromString(record).features.feature
    # `in` first: reading a missing key of a message map would insert it.
    image = feature["image"].bytes_list.value if "image" in feature else ()
    label = feature["label"].int64_list.value if "label" in feature else ()
    if len(label) != 1:
        raise ValueError(f"the record holds {len(label)} labels, not one")
    return {"image": image[0] if image else b"", "label": label[0]}


class ExampleRecords(Sequence):
    """`raw` (a tfds data source read with `DeserializeMethod.RAW_BYTES`) parsed per record."""

    def __init__(self, raw: Sequence[bytes]) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        return parse(self._raw[index])
