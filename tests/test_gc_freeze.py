"""jia_jax/gc_freeze.py, the trainer's use of it, and scripts/bench/gc_pauses.py."""

import gc
import json
import sys
import weakref

import pytest

from configs import digits
from jia_jax import gc_freeze, loop, metrics
from scripts.bench import gc_pauses
from tests.main_util import main_in_process


class _Cycle:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_freeze_collects_then_freezes_the_survivors_until_the_block_ends():
    before = gc.get_freeze_count()
    garbage, kept = _Cycle(), _Cycle()
    dead = weakref.ref(garbage)
    del garbage
    with gc_freeze.GcFreeze() as frozen:
        assert gc.get_freeze_count() == before and not frozen.frozen
        frozen.freeze()
        assert dead() is None  # collected first, not frozen
        count = gc.get_freeze_count()
        assert count > before and frozen.frozen
        assert gc.is_tracked(kept) and kept.me is kept
        frozen.freeze()  # once only: nothing made since is frozen
        _Cycle()
        assert gc.get_freeze_count() == count
    assert gc.get_freeze_count() == 0 and not frozen.frozen


def test_a_block_that_never_froze_leaves_the_collector_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(gc_freeze.gc, "unfreeze", lambda: calls.append("unfreeze"))
    with gc_freeze.GcFreeze():
        pass
    assert calls == []


@pytest.mark.parametrize("steps", [3, 1])  # 1: the first step's metrics come at the end
def test_the_trainer_freezes_once_its_first_step_has_compiled_and_unfreezes_at_the_end(
    monkeypatch, tmp_path, steps
):
    """Frozen once, after the first step's call (its compile) and before the progress meter
    restarts there, so the collect's pause is not counted as training; unfrozen when the steps
    end, before the final eval. Fails if the loop never freezes, or freezes every log step."""
    events = []
    monkeypatch.setattr(gc_freeze.gc, "freeze", lambda: events.append("freeze"))
    monkeypatch.setattr(gc_freeze.gc, "unfreeze", lambda: events.append("unfreeze"))
    restart, evaluate = metrics.ProgressMeter.restart, loop.evaluate

    def restarted(self, step):
        events.append(("restart", step))
        return restart(self, step)

    def evaluated(*args):
        events.append("eval")
        return evaluate(*args)

    monkeypatch.setattr(metrics.ProgressMeter, "restart", restarted)
    monkeypatch.setattr(loop, "evaluate", evaluated)
    config = digits.get_config()
    config.model.width, config.data.image_size = 4, 8
    config.total_steps, config.log_every_steps = steps, 1
    config.checkpoint_every_steps, config.optimizer.warmup_epochs = 100, 0.0
    loop.train_and_evaluate(config, str(tmp_path))
    assert events.count("freeze") == 1 and events.count("unfreeze") == 1
    freeze = events.index("freeze")
    assert events[freeze + 1] == ("restart", 1)
    assert events.index("unfreeze") > freeze
    assert events[-1] == "eval" and events.index("unfreeze") < len(events) - 1


# ml_collections loads the config file with the import machinery's deprecated load_module.
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_the_command_line_freezes_what_its_imports_built_before_it_trains(monkeypatch, tmp_path):
    """`python -m jia_jax.main` freezes the objects alive before the run starts (the imports'),
    so the collector's passes while the step is traced and compiled skip them."""
    gc.unfreeze()
    frozen_at_training = []
    monkeypatch.setattr(
        loop, "train_and_evaluate", lambda *_: frozen_at_training.append(gc.get_freeze_count())
    )
    main_in_process("--config=configs/digits.py", f"--workdir={tmp_path}")
    assert len(frozen_at_training) == 1 and frozen_at_training[0] > 0, frozen_at_training


def test_pause_timer_records_each_pass_and_summary_keeps_the_steady_window(monkeypatch):
    timer = gc_pauses.PauseTimer()
    clock = iter([100.0, 100.004, 200.0, 200.030])  # perf_counter at each start and stop
    monkeypatch.setattr(gc_pauses.time, "perf_counter", lambda: next(clock))
    walls = iter([1.0, 2.0])
    monkeypatch.setattr(gc_pauses.time, "time", lambda: next(walls))
    timer("start", {"generation": 0})
    timer("stop", {"generation": 0, "collected": 3, "uncollectable": 0})
    timer("start", {"generation": 2})
    timer("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    assert [(w, g, round(ms, 6)) for w, g, ms in timer.pauses] == [(1.0, 0, 4.0), (2.0, 2, 30.0)]

    # Passes at 10:00:01, :05 (two) and :20 local time; progress lines at :02 and :12 (the
    # window), so only the two at :05 count.
    monkeypatch.setattr(gc_pauses.thread_cpu, "local_seconds", lambda wall: wall)
    at = lambda s: 36000 + s  # noqa: E731
    pauses = [(at(1), 2, 50.0), (at(5), 0, 1.0), (at(5), 2, 20.0), (at(20), 1, 3.0)]
    log = "\n".join(
        f"I1201 10:00:{s:02d}.000000 1 loop.py:1] step {n}/10  loss 1.0  images/s 10.0"
        for s, n in ((2, 2), (12, 4)))
    got = gc_pauses.summary(pauses, log)
    assert got["window_s"] == 10
    assert got["gen0"] == {"passes": 1, "total_ms": 1.0, "max_ms": 1.0, "ms_per_s": 0.1}
    assert got["gen1"] == {"passes": 0, "total_ms": 0, "max_ms": 0.0, "ms_per_s": 0.0}
    assert got["gen2"] == {"passes": 1, "total_ms": 20.0, "max_ms": 20.0, "ms_per_s": 2.0}
    assert gc_pauses.summary(pauses, log.splitlines()[0]) is None


def test_the_wrapper_runs_the_module_as_main_and_writes_its_passes(tmp_path, monkeypatch):
    """The module runs as __main__ with its own argv; its forced pass is written at exit; with
    --unfrozen its gc.freeze does nothing."""
    (tmp_path / "probe_program.py").write_text(
        "import gc, json, sys\n"
        "if __name__ == '__main__':\n"
        "    gc.collect()\n"
        "    gc.freeze()\n"
        "    json.dump({'argv': sys.argv[1:], 'frozen': gc.get_freeze_count()},\n"
        "              open(sys.argv[1], 'w'))\n"
        "    gc.unfreeze()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []
    monkeypatch.setattr(gc_pauses.atexit, "register", written.append)
    freeze, callbacks = gc.freeze, list(gc.callbacks)
    for unfrozen in (False, True):
        out, seen = tmp_path / f"gc{unfrozen}.json", tmp_path / f"seen{unfrozen}.json"
        argv = [f"--out={out}", *(["--unfrozen"] if unfrozen else []), "--", "-m",
                "probe_program", str(seen), "x"]
        monkeypatch.setattr(sys, "argv", ["gc_pauses"])
        gc_pauses.main(argv)
        gc.freeze = freeze  # what --unfrozen replaced
        gc.callbacks[:] = callbacks  # the wrapper's timer goes with the program
        written.pop()()  # the exit's write
        probe = json.loads(seen.read_text())
        assert probe["argv"] == [str(seen), "x"]
        assert (probe["frozen"] == 0) == unfrozen
        record = json.loads(out.read_text())
        assert record["unfrozen"] == unfrozen
        assert any(generation == 2 for _, generation, _ in record["pauses"])
    try:
        gc_pauses.main([f"--out={tmp_path / 'x.json'}", "--", "probe_program"])
    except SystemExit as stopped:
        assert stopped.code == 2
    else:
        raise AssertionError("a program without -m was taken")


def test_over_intervals_is_all_images_over_all_time_after_the_first_interval():
    from scripts.render.benchmarks import over_intervals

    # The first interval (compilation) is left out; then 100 steps of 2 images at 10 images/s
    # (20 s) and 300 at 30 images/s (20 s): 800 images in 40 s, where the median says 20 or 30.
    intervals = [[50, 1.0], [150, 10.0], [450, 30.0]]
    assert abs(over_intervals(intervals, 2) - 800 / 40) < 1e-12
