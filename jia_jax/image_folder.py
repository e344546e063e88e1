"""A folder of images as a dataset: a sub-folder per split, and in it a sub-folder per class.

The layout tfds's `ImageFolder` builder reads, used as it is (nothing to prepare)::

  <data.data_dir>/train/<class name>/<image>.jpg
  <data.data_dir>/validation/<class name>/<image>.jpg   (any split name: data.eval_split)

The classes are the class folders of all splits in sorted order (label i is the i-th name), as
tfds's `ImageFolder` has them. Images are the .jpg, .jpeg and .png files (any case) of each class
folder, in sorted order. Each process reads a contiguous part of a split by index, exactly as
`jia_jax.tfds_input` reads a tfds ArrayRecord dataset: the same crops, batches and resume.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any, Self

NAME = "image_folder"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class FolderRecords(Sequence):
    """Records ``{"image": encoded bytes, "label": int}`` of a list of image files."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int]) -> None:
        self._paths, self._labels = list(paths), list(labels)

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        with open(self._paths[index], "rb") as f:
            return {"image": f.read(), "label": self._labels[index]}

    def locate(self, index: int) -> tuple[str, int]:
        """(file, record position in it) of record `index`, for messages about a bad one."""
        return self._paths[index], 0

    def part(self, process_index: int, process_count: int, *, drop_remainder: bool) -> Self:
        """This process's contiguous part, split as `tfds.split_for_jax_process` splits: equal
        parts, the remainder dropped or given one each to the first parts."""
        start, stop = part_bounds(len(self), process_index, process_count, drop_remainder)
        return type(self)(self._paths[start:stop], self._labels[start:stop])


def part_bounds(
    size: int, process_index: int, process_count: int, drop_remainder: bool
) -> tuple[int, int]:
    """[start, stop) of part `process_index` of `process_count` of `size` records."""
    base, extra = divmod(size, process_count)
    if drop_remainder:
        return process_index * base, (process_index + 1) * base
    start = process_index * base + min(process_index, extra)
    return start, start + base + (process_index < extra)


class ImageFolder:
    """The splits of an image folder (the layout above), each listed once.

    Args:
      root: The folder (`data.data_dir`).

    Raises:
      FileNotFoundError: naming --config.data.data_dir: `root` is not a folder of split folders.
    """

    def __init__(self, root: str | None) -> None:
        if not root or not os.path.isdir(root):
            raise FileNotFoundError(
                f"--config.data.data_dir={root}: data.name={NAME!r} reads a folder of "
                "<split>/<class>/<image> files, and this is not a folder."
            )
        self._root = root
        self.splits = _subfolders(root)
        if not self.splits:
            raise FileNotFoundError(
                f"--config.data.data_dir={root} holds no split folder (train/, validation/, ...)."
            )
        # As tfds's ImageFolder: the classes of every split, so that labels agree across them.
        classes = {c for split in self.splits for c in _subfolders(os.path.join(root, split))}
        self.class_names = tuple(sorted(classes))
        self._records: dict[str, FolderRecords] = {}

    def check_splits(self, **fields: str) -> None:
        """Raises `FileNotFoundError` naming the field (e.g. ``eval_split="val"``) whose split
        has no folder, and the split folders there are."""
        for field, split in fields.items():
            if split not in self.splits:
                raise FileNotFoundError(
                    f"--config.data.{field}={split}: no folder {os.path.join(self._root, split)}; "
                    f"the split folders of --config.data.data_dir are {list(self.splits)}."
                )

    def records(self, split: str) -> FolderRecords:
        """Every image of `split`, labelled by its class folder's index in `class_names`.

        Raises:
          FileNotFoundError: `split` is not a folder of `root`, or holds no image.
        """
        if split not in self._records:
            self.check_splits(split=split)
            directory = os.path.join(self._root, split)
            self._records[split] = _list_images(directory, self.class_names)
        return self._records[split]


@functools.cache
def open_folder(root: str | None) -> ImageFolder:
    """`ImageFolder(root)`, made once per process."""
    return ImageFolder(root)


def _subfolders(directory: str) -> tuple[str, ...]:
    return tuple(sorted(e.name for e in os.scandir(directory) if e.is_dir()))


def _list_images(directory: str, classes: Sequence[str]) -> FolderRecords:
    """Every image in the class folders of `directory`, labelled by the index in `classes`."""
    paths, labels = [], []
    for name in _subfolders(directory):
        folder = os.path.join(directory, name)
        images = sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_SUFFIXES))
        paths += [os.path.join(folder, f) for f in images]
        labels += [classes.index(name)] * len(images)
    if not paths:
        raise FileNotFoundError(
            f"{directory} holds no image ({', '.join(IMAGE_SUFFIXES)}) in class folders."
        )
    return FolderRecords(paths, labels)
