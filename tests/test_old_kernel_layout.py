"""Checkpoints and exported files written before the models stored conv kernels (out, h, w, in)
(`jia_jax.models.conv`) hold them (h, w, in, out): both read them into today's layout, exactly.

The "old" files are made from today's state: every 4-D leaf of the digits ResNet-18 (small
inputs: each conv is a `models.conv.Conv`, no space-to-depth stem) and of its momentum is
transposed with `to_flax_kernel` before it is written.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from configs import digits
from jia_jax import checkpoint
from jia_jax import checkpoint_layout
from jia_jax import checkpoint_restore
from jia_jax import export
from jia_jax import models
from jia_jax import optimizers
from jia_jax import train
from jia_jax.models.conv import to_flax_kernel
from tests.test_checkpoint import assert_bitwise_equal

IMAGE = 8
MODEL = {"name": "resnet18", "width": 4, "small_inputs": True}
# The digits ResNet-18's convolutions: the stem, 16 in the blocks and 3 projections.
CONV_KERNELS = 20


def two_by_four() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("node", "gpu"))


@pytest.fixture(scope="module")
def mesh():
    return two_by_four()


def create_model():
    fields = {k: v for k, v in MODEL.items() if k != "name"}
    return models.create_model(MODEL["name"], num_classes=10, dtype=jnp.float32, **fields)


def random_like(tree, seed):
    """Host arrays of `tree`'s shapes and dtypes (arrays or `jax.ShapeDtypeStruct`s): random
    floats (momentum is zero at init: a transposed zero would pass for anything), other dtypes
    zero."""
    rng = np.random.default_rng(seed)

    def draw(x):
        if not np.issubdtype(x.dtype, np.floating):
            return np.zeros(x.shape, x.dtype)
        return rng.standard_normal(x.shape).astype(x.dtype)

    return jax.tree.map(draw, tree)


def in_old_layout(tree):
    """`tree` with every 4-D leaf (a conv kernel, or its momentum) stored (h, w, in, out)."""
    return jax.tree.map(lambda x: np.asarray(to_flax_kernel(x)) if np.ndim(x) == 4 else x, tree)


@functools.cache
def training_state(optimizer: str):
    """(host state with random values, abstract state on the 2x4 mesh) of the digits trainer."""
    config = digits.get_config()
    config.optimizer.name = optimizer
    model = create_model()
    tx = optimizers.create_optimizer(config.optimizer, optax.constant_schedule(0.1))
    _, abstract = train.state_initializer(
        model, tx, two_by_four(), (IMAGE, IMAGE, 1), config.precision, seed=0
    )
    return random_like(abstract, seed=1), abstract  # nothing compiled


def save(directory, step, host_state, abstract):
    """Writes `host_state` placed as `abstract` says, as the trainer saves."""
    state = jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), host_state, abstract)
    with checkpoint.Checkpointer(directory, max_to_keep=2, save_every_steps=1) as ckpt:
        assert ckpt.save(step, state, {"step": step})
        ckpt.wait()


@pytest.mark.parametrize("optimizer", ["sgd", "lars"])
def test_old_layout_checkpoint_restores_transposed_bit_for_bit(tmp_path, caplog, optimizer):
    host, abstract = training_state(optimizer)
    old = in_old_layout(host)
    old_shapes = [np.shape(x) for x in jax.tree.leaves(old) if np.ndim(x) == 4]
    assert len(old_shapes) == 2 * CONV_KERNELS  # the kernels and their momentum
    assert old_shapes != [np.shape(x) for x in jax.tree.leaves(host) if np.ndim(x) == 4]
    save(tmp_path, 5, old, abstract)

    with caplog.at_level("INFO"):
        with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
            step, state, meta = ckpt.restore_latest(abstract)
    assert (step, meta) == (5, {"step": 5})
    # Each kernel is its old copy transposed back (`host`, which `old` was made from); every
    # other leaf is as saved.
    assert_bitwise_equal(state, host)
    assert jax.tree.leaves(jax.tree.map(lambda x: x.sharding, state)) == jax.tree.leaves(
        jax.tree.map(lambda a: a.sharding, abstract)
    )
    assert not (tmp_path / "corrupt").exists()
    [line] = [r.getMessage() for r in caplog.records if "jia_jax" in r.pathname]
    assert line == (
        f"Converted {2 * CONV_KERNELS} arrays of the checkpoint of step 5 from the old "
        "(h, w, in, out) conv kernel layout to (out, h, w, in)."
    )
    # The read-only read of evaluation and export converts the same way.
    step, state, _ = checkpoint_restore.read_checkpoint(tmp_path, abstract)
    assert step == 5
    assert_bitwise_equal(state, host)


def test_old_layout_kernel_partitioned_over_its_out_axis_restores(mesh, tmp_path):
    """A kernel split over its out axis (8 over the 4 "gpu" devices) is read with that axis
    split, last in the stored order: split first, the stored (3, 3, 4, 8) does not divide."""
    kernel = np.random.default_rng(2).standard_normal((8, 3, 3, 4)).astype(np.float32)
    sharding = NamedSharding(mesh, P("gpu"))
    leaf = jax.ShapeDtypeStruct(kernel.shape, np.float32, sharding=sharding)
    abstract = {"conv": {"kernel": leaf}}
    target = checkpoint_layout.restore_target(abstract, frozenset({"conv.kernel"}))
    assert target["conv"]["kernel"].shape == (3, 3, 4, 8)
    assert target["conv"]["kernel"].sharding.spec == P(None, None, None, "gpu")
    save(tmp_path, 1, in_old_layout({"conv": {"kernel": kernel}}), target)

    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        _, state, _ = ckpt.restore_latest(abstract)
    assert_bitwise_equal(state, {"conv": {"kernel": kernel}})
    assert state["conv"]["kernel"].sharding == sharding


def test_only_the_old_kernel_order_of_a_4d_array_of_one_dtype_is_converted():
    f32, bf16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)
    expected = {
        "kernel": ((8, 3, 3, 4), f32),
        "other_order": ((8, 3, 3, 4), f32),
        "other_dtype": ((8, 3, 3, 4), f32),
        "matrix": ((4, 8), f32),
        "same": ((8, 3, 3, 4), f32),
        "cube": ((3, 3, 3, 3), f32),  # reads the same in both orders
    }
    stored = {
        "kernel": ((3, 3, 4, 8), f32),
        "other_order": ((4, 3, 3, 8), f32),
        "other_dtype": ((3, 3, 4, 8), bf16),
        "matrix": ((8, 4), f32),
        "same": ((8, 3, 3, 4), f32),
        "cube": ((3, 3, 3, 3), f32),
    }
    assert checkpoint_layout.old_layout_kernels(stored, expected) == {"kernel"}


def test_another_shape_beside_old_layout_kernels_still_raises(tmp_path):
    host, abstract = training_state("lars")
    old = in_old_layout(host)
    # The stem kernel (4, 3, 3, 1) stored in neither order: (in, w, h, out).
    old.params["stem_conv"]["kernel"] = np.transpose(host.params["stem_conv"]["kernel"])
    save(tmp_path, 3, old, abstract)

    with checkpoint.Checkpointer(tmp_path, max_to_keep=2, save_every_steps=1) as ckpt:
        with pytest.raises(checkpoint_layout.CheckpointMismatchError) as info:
            ckpt.restore_latest(abstract)
        assert ckpt.all_steps() == [3]
    # The one real difference, and how many differ only in the order that is read.
    listed = re.findall(r"\n  (.*)", str(info.value))
    assert listed == [
        "params.stem_conv.kernel: checkpoint float32[1, 3, 3, 4], state float32[4, 3, 3, 1]",
        f"({2 * CONV_KERNELS - 1} more differ only as conv kernels stored in the old "
        "(h, w, in, out) order, which is read)",
    ], str(info.value)
    assert "--workdir" in str(info.value)
    assert not (tmp_path / "corrupt").exists()


def export_file(path, params, batch_stats):
    export.save(
        str(path),
        model=MODEL,
        class_names=list("0123456789"),
        image_size=IMAGE,
        channels=1,
        step=7,
        params=params,
        batch_stats=batch_stats,
    )
    return str(path)


@pytest.fixture(scope="module")
def variables():
    """Random parameters and statistics (variances positive) of the digits ResNet-18, on the
    host."""
    shapes = jax.eval_shape(
        functools.partial(create_model().init, train=False),
        jax.random.key(0),
        jax.ShapeDtypeStruct((1, IMAGE, IMAGE, 1), jnp.float32),
    )
    params, stats = random_like(shapes["params"], seed=3), random_like(shapes["batch_stats"], 4)
    return params, jax.tree.map(np.abs, stats)


def test_export_load_of_old_layout_file_predicts_as_the_new_layout(tmp_path, variables):
    params, batch_stats = variables
    new = export.load(export_file(tmp_path / "new.msgpack", params, batch_stats))
    old = export.load(export_file(tmp_path / "old.msgpack", in_old_layout(params), batch_stats))
    assert_bitwise_equal(old.variables["params"], new.variables["params"])
    images = np.random.default_rng(5).standard_normal((16, IMAGE, IMAGE, 1)).astype(np.float32)
    # The same variables, bit for bit, through the same float32 program on the same device:
    # the same logits, bit for bit.
    logits = new.logits(images)
    np.testing.assert_array_equal(old.logits(images), logits)
    assert np.ptp(logits, axis=0).min() > 0  # each logit depends on the image (the convs)


def test_export_load_of_another_shape_or_parameter_names_it(tmp_path, variables):
    params, batch_stats = variables
    wrong = in_old_layout(params)
    wrong["stage2_block1"]["proj_conv"]["kernel"] = np.zeros((1, 1, 4, 9), np.float32)
    path = export_file(tmp_path / "wrong.msgpack", wrong, batch_stats)
    with pytest.raises(ValueError) as info:
        export.load(path)
    assert str(info.value) == (
        f"{path}: parameter ['stage2_block1']['proj_conv']['kernel'] has shape [1, 1, 4, 9] in "
        "the file, but the model expects [8, 1, 1, 4]."
    )
    extra = {**params, "extra": {"bias": np.zeros(3, np.float32)}}
    path = export_file(tmp_path / "extra.msgpack", extra, batch_stats)
    with pytest.raises(ValueError, match=re.escape("['extra']['bias'] has shape [3] in the file")):
        export.load(path)
    missing = {k: v for k, v in params.items() if k != "classifier"}
    path = export_file(tmp_path / "missing.msgpack", missing, batch_stats)
    with pytest.raises(ValueError, match=re.escape("parameters ['classifier']['bias'], ")):
        export.load(path)
