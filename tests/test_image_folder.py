"""A folder of class sub-folders of JPEGs as a dataset: listed, split by process, read by the
same pipeline as a tfds dataset, and trained on by the trainer."""

import re
from pathlib import Path

import numpy as np
import PIL.Image
import pytest

from jia_jax import export, image_folder, tfds_input
from tests import main_util, test_export
CLASSES = ("cat", "dog", "fish")  # written in another order than sorted, below
TRAIN_PER_CLASS, EVAL_PER_CLASS = 6, 3
# Class c's images are filled with green level GREEN[c]: a decoded image names its label.
GREEN = {"cat": 40, "dog": 120, "fish": 200}
SIZE = 8


def write_jpeg(path: Path, green: int, width: int, height: int) -> None:
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[..., 1] = green
    PIL.Image.fromarray(pixels).save(path, format="JPEG", quality=100, subsampling=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """root/{train,validation}/{fish,dog,cat}/*.jpg, varied sizes, and files to ignore."""
    root = tmp_path_factory.mktemp("photos")
    for split, count in (("train", TRAIN_PER_CLASS), ("validation", EVAL_PER_CLASS)):
        for name in reversed(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                write_jpeg(root / split / name / f"{i}.JPG", GREEN[name], 20 + 3 * i, 16 + i)
            (root / split / name / "notes.txt").write_text("not an image")
    return root


def test_classes_are_the_sorted_folders_and_every_image_is_listed(folder):
    info = tfds_input.dataset_info(image_folder.NAME, str(folder))
    assert info == (3, 3 * TRAIN_PER_CLASS, 3 * EVAL_PER_CLASS, CLASSES)


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_eval_reads_every_image_once_with_its_folders_label(folder, process_count):
    seen = []
    for process in range(process_count):
        batches = tfds_input.eval_batches(
            image_folder.NAME,
            data_dir=str(folder),
            split="validation",
            image_size=SIZE,
            local_batch=2,
            process_index=process,
            process_count=process_count,
            image_dtype="uint8",
        )
        for batch in batches:
            real = batch["mask"] == 1
            seen += list(zip(batch["label"][real], batch["image"][real, :, :, 1].mean((1, 2))))
    assert len(seen) == 3 * EVAL_PER_CLASS
    for label, green in seen:
        # JPEG at quality 100 of a flat colour: within a few levels.
        assert abs(green - GREEN[CLASSES[label]]) <= 3, (label, green)


def test_process_parts_are_contiguous_disjoint_and_cover_the_split():
    for size, count in ((10, 3), (9, 3), (2, 4)):
        kept = [image_folder.part_bounds(size, p, count, False) for p in range(count)]
        assert kept[0][0] == 0 and kept[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(kept, kept[1:], strict=False))
        dropped = [image_folder.part_bounds(size, p, count, True) for p in range(count)]
        assert {stop - start for start, stop in dropped} == {size // count}


def test_a_missing_split_or_folder_names_the_field(folder, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--config\.data\.eval_split=test: no folder .*"
                       r"the split folders of --config\.data\.data_dir are \['train', "
                       r"'validation'\]"):
        tfds_input.dataset_info(image_folder.NAME, str(folder), "train", "test")
    with pytest.raises(FileNotFoundError, match=r"--config\.data\.data_dir=.*is not a folder"):
        tfds_input.dataset_info(image_folder.NAME, str(tmp_path / "nowhere"))


def test_the_trainer_trains_two_steps_evaluates_and_exports_a_photo_classifier(folder, tmp_path):
    flags = [
        "--config=configs/digits.py",
        f"--workdir={tmp_path}",
        "--config.data.name=image_folder",
        f"--config.data.data_dir={folder}",
        f"--config.data.image_size={SIZE}",
        "--config.model.width=2",
        "--config.global_batch_size=8",
        "--config.eval_batch_size=8",
        "--config.total_steps=2",
        "--config.optimizer.warmup_epochs=0",
    ]
    trained = run_main(*flags)
    assert re.search(
        rf"final eval at step 2: top-1 [\d.]+, top-5 [\d.]+ over {3 * EVAL_PER_CLASS} examples",
        trained,
    ), trained[-3000:]
    run_main(*flags, "--mode=export")
    exported = tmp_path / "export" / "step_2.msgpack"  # the default --export_path

    # The docs' snippet, on two of the folder's images.
    photos = [folder / "validation" / name / "0.JPG" for name in ("dog", "fish")]
    doc_path, doc_photos = "/tmp/jia_jax/photos/export/step_1000.msgpack", '["cat.jpg", "dog.jpg"]'
    result = test_export.run_doc_snippet(
        "tests/test_image_folder.py",
        {doc_path: str(exported), doc_photos: repr([str(p) for p in photos])},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    for photo, line in zip(photos, lines, strict=True):
        # 2 steps from random weights: any class, with a probability of at least 1/3.
        match = re.fullmatch(rf"{photo}: ({'|'.join(CLASSES)}) \((0\.\d\d|1\.00)\)", line)
        assert match and float(match.group(2)) >= 0.33, line

    # `preprocess` gives the pixels evaluation reads of the same file.
    classifier = export.load(str(exported))
    [batch] = tfds_input.eval_batches(
        image_folder.NAME,
        data_dir=str(folder),
        split="validation",
        image_size=SIZE,
        local_batch=3 * EVAL_PER_CLASS,
        process_index=0,
        process_count=1,
        image_dtype="uint8",
    )
    first_dog = CLASSES.index("dog") * EVAL_PER_CLASS  # files sorted by class, then name
    expected = batch["image"][first_dog]
    np.testing.assert_array_equal(classifier.preprocess(PIL.Image.open(photos[0])), expected)


def run_main(*flags: str) -> str:
    """`python -m jia_jax.main FLAGS` on 8 CPU devices (conftest's XLA_FLAGS); its log."""
    result = main_util.run_main(*flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr
