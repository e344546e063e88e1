"""Trained parameters in one file, and a classifier built from that file alone.

`python -m jia_jax.main --mode=export --config=... --workdir=...` writes the newest checkpoint's
(or `--step`'s) model parameters and BatchNorm statistics, in float32, to one file
(`--export_path`; by default ``<workdir>/export/step_<N>.msgpack``), with what rebuilds the model
and reads its input: the model fields of the config, the class names, the image size and the
number of channels. No optimizer state and no training config: the file is
`flax.serialization`'s msgpack of plain numpy arrays. On any machine, CPU included::

  classifier = export.load("model.msgpack")
  pixels = np.stack([classifier.preprocess(PIL.Image.open(p)) for p in paths])
  names = [classifier.class_names[i] for i in classifier.predict(pixels)]

Images go in as the trainer's eval step takes them: uint8 RGB pixels of the eval crop
(`preprocess`), normalised inside; or already normalised floats (the digits set, as
`input_pipeline.digits_split` returns it), used as they are.

Files written before the models stored conv kernels (out, h, w, in) (`jia_jax.models.conv`) hold
them (h, w, in, out); `load` transposes them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import PIL.Image
from absl import logging

from jia_jax import evaluate
from jia_jax import loop
from jia_jax import models
from jia_jax import normalize
from jia_jax.models import conv

FORMAT = "jia_jax.export/1"


class Classifier:
    """A trained model with its variables, classifying batches of images on the default device.

    Args:
      model: The unbound Flax module (float32).
      variables: ``{"params": ..., "batch_stats": ...}`` of numpy arrays.
      image_size: Height and width of its input.
      channels: Channels of its input.
      class_names: Label i's name.
      step: The training step the parameters are from.
    """

    def __init__(
        self,
        model: nn.Module,
        variables: Mapping[str, Any],
        *,
        image_size: int,
        channels: int,
        class_names: Sequence[str],
        step: int,
    ) -> None:
        self.model, self.variables = model, variables
        self.image_size, self.channels = image_size, channels
        self.class_names, self.step = tuple(class_names), step
        self._logits = jax.jit(functools.partial(_logits, model))

    def logits(self, images: np.ndarray) -> np.ndarray:
        """float32 [N, num_classes] of images [N, image_size, image_size, channels]."""
        return np.asarray(self._logits(self.variables, images))

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        """The softmax of `logits`: each row sums to 1."""
        return np.asarray(jax.nn.softmax(self.logits(images), axis=-1))

    def predict(self, images: np.ndarray) -> np.ndarray:
        """The most probable class of each image, int [N]."""
        return self.logits(images).argmax(axis=-1)

    def preprocess(self, image: PIL.Image.Image) -> np.ndarray:
        """uint8 RGB pixels [image_size, image_size, 3] of `image` as evaluation crops it."""
        from jia_jax import tfds_input  # imported here: pulls in tfds and grain

        return tfds_input.eval_pixels(image, self.image_size)


def _logits(model: nn.Module, variables: Mapping[str, Any], images: jax.Array) -> jax.Array:
    return model.apply(variables, normalize.model_input(images, jnp.float32), train=False)


def save(
    path: str,
    *,
    model: Mapping[str, Any],
    class_names: Sequence[str],
    image_size: int,
    channels: int,
    step: int,
    params: Any,
    batch_stats: Any,
) -> None:
    """Writes the parameters and batch statistics (as float32 numpy) and what rebuilds the model.

    Args:
      path: The file to write; its folder is created.
      model: The config's ``model`` fields (``name`` and the constructor's fields).
      class_names: Label i's name, for each of the model's outputs.
      image_size: Height and width of the input.
      channels: Channels of the input.
      step: The training step the parameters are from.
      params: The model parameters (any arrays).
      batch_stats: The BatchNorm running statistics.
    """
    as_numpy = functools.partial(jax.tree.map, lambda x: np.asarray(x, np.float32))
    record = {
        "format": FORMAT,
        "model": dict(model),
        "class_names": list(class_names),
        "image_size": image_size,
        "channels": channels,
        "step": step,
        "params": as_numpy(params),
        "batch_stats": as_numpy(batch_stats),
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(flax.serialization.msgpack_serialize(record))


def load(path: str) -> Classifier:
    """The `Classifier` of an exported file.

    Raises:
      ValueError: `path` is not a file this module wrote, or its parameters are not the model's
        (a parameter missing, extra or of another shape).
    """
    with open(path, "rb") as f:
        record = flax.serialization.msgpack_restore(f.read())
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a model exported by jia_jax (--mode=export).")
    fields = {k: v for k, v in record["model"].items() if k != "name"}
    model = models.create_model(
        record["model"]["name"],
        num_classes=len(record["class_names"]),
        dtype=jnp.float32,
        **fields,
    )
    image = (1, record["image_size"], record["image_size"], record["channels"])
    expected = jax.eval_shape(
        functools.partial(model.init, train=False),
        jax.random.key(0),
        jax.ShapeDtypeStruct(image, jnp.float32),
    )
    return Classifier(
        model,
        {
            "params": _in_model_layout(path, record["params"], expected["params"]),
            "batch_stats": record["batch_stats"],
        },
        image_size=record["image_size"],
        channels=record["channels"],
        class_names=record["class_names"],
        step=record["step"],
    )


def _in_model_layout(path: str, params: Any, expected: Any) -> Any:
    """`params` of the file `path` with each conv kernel stored (h, w, in, out) (files of earlier
    versions) transposed to the (out, h, w, in) of `expected` (the model's shapes).

    Raises:
      ValueError: A parameter is in only one of `params` and `expected`, or its shape is in
        neither order.
    """
    shapes = {
        jax.tree_util.keystr(name): leaf.shape
        for name, leaf in jax.tree_util.tree_leaves_with_path(expected)
    }

    def matched(name: jax.tree_util.KeyPath, x: np.ndarray) -> np.ndarray:
        key, shape = jax.tree_util.keystr(name), np.shape(x)
        want = shapes.pop(key, None)
        if want == shape:
            return x
        if want is not None and len(want) == 4 and shape == conv.flax_order(want):
            return np.asarray(conv.from_flax_kernel(x))
        raise ValueError(
            f"{path}: parameter {key} has shape {list(shape)} in the file, but the model "
            + (f"expects {list(want)}." if want is not None else "has no such parameter.")
        )

    converted = jax.tree_util.tree_map_with_path(matched, params)
    if shapes:
        raise ValueError(f"{path}: the model's parameters {', '.join(shapes)} are not in the file.")
    return converted


def export_checkpoint(
    config: ml_collections.ConfigDict,
    workdir: str,
    path: str | None = None,
    step: int | None = None,
) -> str:
    """Writes the checkpoint of `step` (None: the newest) of `workdir` to `path` (None:
    ``<workdir>/export/step_<N>.msgpack``); returns the path. Every process must call it;
    process 0 writes."""
    peers, mesh = loop.connect(config)
    with peers.reporting(evaluate.checkpoint_dir(workdir)):
        restored = evaluate.restore(config, mesh, workdir, step)
    path = path or os.path.join(workdir, "export", f"step_{restored.step}.msgpack")
    info = restored.trainer.data.info
    if jax.process_index() == 0:
        save(
            path,
            model=config.model.to_dict(),
            class_names=info.class_names,
            image_size=config.data.image_size,
            channels=info.channels,
            step=restored.step,
            params=jax.device_get(restored.state.params),
            batch_stats=jax.device_get(restored.state.batch_stats),
        )
        logging.info(
            "exported the checkpoint of step %d to %s (%s bytes)",
            restored.step,
            path,
            f"{os.path.getsize(path):,}",
        )
    return path
