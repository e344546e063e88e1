"""Tests for jia_jax.step_graphs: when the step's convolutions go into command buffers, the option
that puts them there, and the priming order (the executable without them runs first)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from jia_jax import recipe
from jia_jax import step_graphs


@pytest.mark.parametrize(
    "mode, platform, flags, expected",
    [
        ("auto", "gpu", "", True),
        ("auto", "gpu", "--xla_gpu_autotune_level=4", True),
        ("auto", "gpu", "--xla_gpu_enable_command_buffer=+FUSION", False),  # the user's choice
        ("auto", "cpu", "", False),
        ("always", "gpu", "--xla_gpu_enable_command_buffer=", True),
        ("always", "cpu", "", False),  # no command buffers off GPUs
        ("never", "gpu", "", False),
    ],
)
def test_wanted(mode, platform, flags, expected):
    assert step_graphs.wanted(mode, platform, flags) is expected


def test_a_bad_mode_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"launch.convolution_graphs='on' is not one of"):
        step_graphs.wanted("on", "gpu", "")
    with pytest.raises(ValueError, match="always"):
        step_graphs.for_training(jax.jit(lambda x: x), "yes", "")


def test_the_option_names_kinds_this_xla_knows():
    """XLA refuses an unknown kind ('... is not a valid enum value'); the option must list only
    known ones, convolutions among them, on the jax versions the code runs on."""
    kinds = step_graphs.WITH_CONVOLUTIONS.split(",")
    assert "CONVOLUTION" in kinds and "FUSION" in kinds and len(set(kinds)) == len(kinds)
    lowered = jax.jit(lambda x: 2 * x).lower(jnp.ones(3))
    compiled = lowered.compile({step_graphs.OPTION: step_graphs.WITH_CONVOLUTIONS})
    np.testing.assert_array_equal(compiled(jnp.ones(3)), 2 * np.ones(3))
    with pytest.raises(Exception, match="not a valid enum value"):
        lowered.compile({step_graphs.OPTION: "FUSION,NOT_A_KIND"})


class _FakeLowered:
    """Records each compile's options; its executables record each call."""

    def __init__(self, calls):
        self.calls = calls

    def compile(self, options=None):
        name = "graphs" if options == {step_graphs.OPTION: step_graphs.WITH_CONVOLUTIONS} else (
            "plain" if options is None else f"other {options}"
        )
        self.calls.append(f"compile {name}")

        def run(*args):
            self.calls.append(f"run {name}")
            return name, args

        return run


class _FakeStep:
    def __init__(self):
        self.calls = []

    def lower(self, *args):
        self.calls.append("lower")
        return _FakeLowered(self.calls)


def test_the_first_step_runs_without_graphs_and_every_later_one_with_them():
    """The capture of a convolution cuDNN has not run in the process fails (unknown cudnn
    status 5003): the executable without graphs must run before the one with them ever does."""
    fake = _FakeStep()
    step = step_graphs.GraphStep(fake)
    assert step("s0", "b") == ("plain", ("s0", "b"))
    assert step("s1", "b") == ("graphs", ("s1", "b"))
    assert step("s2", "b") == ("graphs", ("s2", "b"))
    assert fake.calls.index("run plain") < fake.calls.index("run graphs")
    assert fake.calls.count("lower") == 1 and fake.calls.count("run plain") == 1
    assert fake.calls.count("compile graphs") == 1 and fake.calls.count("run graphs") == 2


class _OptionsLowered:
    """Records each compile's options; its executables return their inputs' sum and the
    options they were compiled with."""

    def __init__(self):
        self.compiles = []

    def compile(self, options=None):
        self.compiles.append(options)
        return lambda state, x: ((state + x, options), None)


def test_compile_like_training_gives_other_options_to_both_compiles(monkeypatch):
    """A benchmark variant's own compiler options reach the priming compile and the one with
    graphs (there with the command-buffer kinds added); options that set the kinds themselves
    are the caller's: one plain compile, no priming step."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    other = {"xla_gpu_all_reduce_combine_threshold_bytes": 1 << 20}
    lowered = _OptionsLowered()
    compiled, state, graphs = step_graphs.compile_like_training(
        lowered, "auto", 1, 2, options=other)
    assert graphs is True
    assert lowered.compiles == [{**other, step_graphs.OPTION: step_graphs.WITH_CONVOLUTIONS},
                                other]
    assert state == (3, other)  # the priming run's: compiled with the options, no graphs
    assert compiled(0, 1)[0][1] == lowered.compiles[0]
    theirs = {step_graphs.OPTION: "FUSION"}
    lowered = _OptionsLowered()
    _, state, graphs = step_graphs.compile_like_training(lowered, "auto", 1, 2, options=theirs)
    assert graphs is False and state == 1 and lowered.compiles == [theirs]


def test_graph_step_trains_as_the_jitted_step_with_donated_state():
    """Through jax's own lower/compile/call with the state donated: the same values as the
    jitted step, step for step (off GPUs the option changes nothing), and no donated input is
    read twice (the plain run's outputs are what the next step gets)."""

    def update(state, batch):
        new = {"w": state["w"] - 0.1 * jnp.mean(batch) * state["w"], "n": state["n"] + 1}
        return new, {"norm": jnp.linalg.norm(new["w"])}

    jitted = jax.jit(update, donate_argnums=0)
    batches = [jnp.full((4,), float(i + 1)) for i in range(4)]
    start = {"w": jnp.arange(3.0), "n": jnp.zeros((), jnp.int32)}
    expected_w = np.arange(3.0)
    state = jax.tree.map(jnp.copy, start)
    step = step_graphs.GraphStep(jitted)
    for batch in batches:
        state, metrics = step(state, batch)
        expected_w = expected_w - 0.1 * np.mean(np.asarray(batch, np.float64)) * expected_w
        np.testing.assert_allclose(np.asarray(state["w"]), expected_w, rtol=1e-6)
        np.testing.assert_allclose(float(metrics["norm"]), np.linalg.norm(expected_w), rtol=1e-6)
    assert int(state["n"]) == len(batches)


def test_for_training_leaves_the_step_as_it_is_off_gpus():
    jitted = jax.jit(lambda x: x)
    assert step_graphs.for_training(jitted, "always", "") is jitted  # this test runs on CPU


def test_the_setting_is_free_on_resume():
    """How kernels are launched is not the run's maths: a checkpoint from before the setting
    existed, or with another value, resumes without allow_config_change."""
    config = default.get_config()
    assert config.launch.convolution_graphs == "auto"
    current = recipe.of_run(config.to_json(), num_devices=8)
    del config["launch"]
    meta = {"step": 5, "seed": 0, "config": config.to_json(), "num_devices": 8}
    recipe.check_resume(meta, current, allow_change=False, step=5, directory="/c")
    current["launch.convolution_graphs"] = "never"
    recipe.check_resume(meta, current, allow_change=False, step=5, directory="/c")


def test_a_cudnn_failure_with_graphs_names_the_setting_that_turns_them_off():
    failure = jax.errors.JaxRuntimeError(
        "UNKNOWN: <unknown cudnn status: 5003>\nin xla/stream_executor/cuda/cuda_dnn.cc(5245)"
    )
    text = step_graphs.error_text(failure, "auto", "gpu", "")
    assert "\n" not in text and "unknown cudnn status: 5003" in text
    assert "--config.launch.convolution_graphs=never" in text
    assert step_graphs.error_text(failure, "never", "gpu", "") is None  # graphs were off
    assert step_graphs.error_text(failure, "auto", "cpu", "") is None
    flags = "--xla_gpu_enable_command_buffer=+CONVOLUTION"  # the user's own graphs: theirs
    assert step_graphs.error_text(failure, "auto", "gpu", flags) is None
    other = jax.errors.JaxRuntimeError("INTERNAL: NCCL operation ncclAllReduce failed")
    assert step_graphs.error_text(other, "auto", "gpu", "") is None
    assert step_graphs.error_text(ValueError("cudnn"), "auto", "gpu", "") is None


def test_compile_like_training_off_gpus_compiles_plainly_and_keeps_the_state():
    """On CPU (no command buffers) the benchmarks' compile is jax's own: no priming step ran,
    so the state given back is the one passed, still usable."""
    step = jax.jit(lambda state, x: (state + x, {"sum": jnp.sum(state)}), donate_argnums=0)
    state = jnp.arange(4.0)
    compiled, same, graphs = step_graphs.compile_like_training(
        step.lower(state, 1.0), "auto", state, 1.0
    )
    assert graphs is False and same is state
    np.testing.assert_array_equal(compiled(same, 1.0)[0], np.arange(4.0) + 1)


def test_the_train_loop_through_a_graph_step_trains_bit_for_bit_as_without(tmp_path, monkeypatch):
    """The train loop's calls (state, batch, stop flags; metrics fetched late; a checkpoint
    between) through a `GraphStep`, whose later calls go to an executable compiled apart from
    jax.jit's own, end in the same parameters and statistics bit for bit (off GPUs the option
    compiles the same program). Fails if the loop's arguments stop matching the executable's."""
    from jia_jax import loop
    from tests.test_resume import OVERRIDES, assert_bitwise_equal, configured, read_state

    config = configured({**OVERRIDES, "total_steps": 5, "checkpoint_every_steps": 3})
    loop.train_and_evaluate(config, str(tmp_path / "plain"))
    made, real = [], step_graphs.GraphStep

    def graph_step(step):
        made.append(real(step))
        return made[-1]

    monkeypatch.setattr(step_graphs, "GraphStep", graph_step)
    monkeypatch.setattr(step_graphs, "wanted", lambda mode, platform, flags: True)
    loop.train_and_evaluate(config, str(tmp_path / "graphs"))
    [step] = made
    assert step._graphs is not None  # its later calls went to the executable with the option
    for at in (3, 5):
        assert_bitwise_equal(read_state(tmp_path / "graphs", at), read_state(tmp_path / "plain", at))
