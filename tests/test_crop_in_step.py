"""scripts/bench/crop_in_step.py: its three variants train the same step on the same crops."""

import functools

import jax
import numpy as np

from jia_jax import crop_resize, train
from scripts.bench import crop_in_step, trainer_step


def test_crop_apart_or_in_the_step_program_trains_the_same_step():
    # The benchmark compares the crop's cost three ways; that comparison means something only if
    # all three compute one update: the step on the crop's images, whether they were made
    # beforehand, by the crop's own program, or inside the step's program. The crop rounds to
    # uint8 pixels, so the images are equal bit for bit, and so are the updates.
    per_gpu, device = 4, jax.local_devices()[0]
    config = trainer_step.make_config(
        "alexnet_bn", "flat", 1, 1, per_device_batch_override=per_gpu, image_size=32,
        model_width=8, small_inputs=True,
    )
    config.optimizer.warmup_epochs = 0  # the first step's learning rate is not 0: it moves
    setup = trainer_step.build_setup(config, [device])
    step = train.make_train_step(
        setup["model"], setup["tx"], setup["schedule"], config, setup["mesh"]
    )
    # The GPU path's canvas: each generated JPEG decoded whole into one tile.
    inputs = crop_in_step.crop_inputs(per_gpu, config.data.image_size, canvas=512)
    assert inputs["tiles"].shape == (per_gpu, 512, 512, 3) and inputs["one_tile_each"]
    crop = functools.partial(
        crop_resize.crop_resize, batch=per_gpu, image_size=config.data.image_size,
        one_tile_each=inputs.pop("one_tile_each"), kernel="xla",
    )
    batch = {**setup["batch"], **jax.device_put(inputs, device)}
    runs = crop_in_step.variants(step, crop, batch)
    assert sorted(runs) == sorted(crop_in_step.VARIANTS)
    images = np.asarray(runs["alone"][1]["image"])
    assert images.dtype == np.uint8 and images.shape == (per_gpu, 32, 32, 3)
    assert not np.array_equal(images, np.asarray(setup["batch"]["image"]))  # the crop's, not
    host = jax.device_get(setup["init"]())
    after = {}
    for name, (run, given) in runs.items():
        state, metrics = run(jax.device_put(host, device), given)
        after[name] = (float(metrics["loss"]), jax.device_get((state.params, state.batch_stats)))
    for name in ("apart", "fused"):
        assert after[name][0] == after["alone"][0]
        jax.tree.map(np.testing.assert_array_equal, after[name][1], after["alone"][1])
    # A step on other images updates the parameters otherwise: the comparison can fail.
    other, _ = step(jax.device_put(host, device), setup["batch"])
    assert any(not np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(jax.device_get(other.params)), jax.tree.leaves(after["alone"][1][0])))
