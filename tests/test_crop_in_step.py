"""scripts/bench/crop_in_step.py: its variants train the same step on the same crops."""

import functools

import jax
import numpy as np

from jia_jax import crop_resize, train
from scripts.bench import crop_in_step, profile_trace, trainer_step


def test_crop_apart_or_in_the_step_program_trains_the_same_step():
    # The benchmark compares the crop's cost five ways; that comparison means something only if
    # all five compute one update: the step on the crop's images, whether they were made
    # beforehand, by the crop's own program, inside the step's program, or a call before beside
    # the step (`streamed` and `grouped`, whose calls also crop the next batch). The crop rounds
    # to uint8 pixels, so the images are equal bit for bit, and so are the updates.
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
        carry = crop_in_step.first_carry(name, jax.device_put(host, device), runs)
        state, metrics = run(carry, given)
        if name in ("streamed", "grouped"):  # the next batch's images: the same tiles and crop
            state, upcoming = state
            np.testing.assert_array_equal(np.asarray(upcoming), images)
        after[name] = (float(metrics["loss"]), jax.device_get((state.params, state.batch_stats)))
    for name in ("apart", "fused", "streamed", "grouped"):
        assert after[name][0] == after["alone"][0]
        jax.tree.map(np.testing.assert_array_equal, after[name][1], after["alone"][1])
    # A step on other images updates the parameters otherwise: the comparison can fail.
    other, _ = step(jax.device_put(host, device), setup["batch"])
    assert any(not np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(jax.device_get(other.params)), jax.tree.leaves(after["alone"][1][0])))


def test_concurrent_length_counts_time_with_two_or_more_kernels_running():
    # Kernels of one CUDA graph are traced on the stream that launched it, so overlap is read
    # from the times alone. Here: [0, 10) and [5, 12) overlap for 5 us, [12, 20) touches the
    # second at 12 (no overlap), [14, 16) lies inside it (2 us), and three run at once nowhere.
    kernels = [profile_trace.Kernel(str(i), a, b, "Stream #14", "fusion")
               for i, (a, b) in enumerate([(0, 10), (5, 12), (12, 20), (14, 16)])]
    assert crop_in_step.concurrent_length(kernels) == 7.0
    assert crop_in_step.concurrent_length(kernels[:1] + kernels[2:3]) == 0.0


_HLO = """HloModule jit_streamed

%async_computation (p: u8[4]) -> u8[4] {
  ROOT %c = u8[4]{0} copy(%p), frontend_attributes={_scheduling_group_id="1"}
}

ENTRY %main.1 (a.1: u8[4], b.1: f32[2]) -> (u8[4], f32[2]) {
  %s0 = (u8[4], u8[4]) async-start(%a.1), frontend_attributes={_xla_stream_annotation="1"}
  %a.1 = u8[4]{0} parameter(0)
  %b.1 = f32[2]{0} parameter(1)
  %d0 = u8[4] async-done(%s0), frontend_attributes={_xla_stream_annotation="1"}
  %s1 = (u8[4], u8[4]) async-start(%d0), async_execution_thread="explicit", \
frontend_attributes={_scheduling_group_id="1",_xla_stream_annotation="1"}
  %fusion.1 = f32[2]{0} fusion(%b.1), kind=kLoop, calls=%fused
  %fusion.2 = f32[2]{0} fusion(%fusion.1), kind=kLoop, calls=%fused, \
frontend_attributes={_scheduling_group_id="1"}
  %d1 = u8[4] async-done(%s1), frontend_attributes={_xla_stream_annotation="1"}
  %other-start = ((f32[2]{0}), f32[2]{0}) async-start(%fusion.2), calls=%async_computation
  %other-done = f32[2]{0} async-done(%other-start)
  ROOT %tuple = (u8[4]{0}, f32[2]{0}) tuple(%d1, %other-done)
}
"""


def test_stream_calls_counts_the_work_scheduled_between_an_annotated_start_and_its_done():
    # As XLA writes optimized HLO: parameters listed after the first start are no work; the
    # unannotated async pair is not a stream call.
    assert crop_in_step.stream_calls(_HLO) == [
        {"start": "s0", "instructions_between": 0, "execution_thread": "main",
         "scheduling_group": None},
        {"start": "s1", "instructions_between": 2, "execution_thread": "explicit",
         "scheduling_group": "1"},
    ]
    # The ENTRY's instructions with a group: s1 and fusion.2, not the fused computation's.
    assert crop_in_step.grouped_instructions(_HLO) == 2
