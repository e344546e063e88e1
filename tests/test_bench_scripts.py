"""Smoke tests of the GPU benchmark scripts at tiny sizes on the 8 simulated CPU devices.

No timing is asserted, only that every requested case is measured and that the derived figures
(bus bandwidth, ratios, images/s, efficiency) are consistent with the measured times.
"""

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import pathlib
import shutil
import statistics
import sys
import time
import typing

import jax
import pytest

from jia_jax import comm_model, crop_resize
from jia_jax import metrics
from scripts.bench import allreduce as bench_allreduce
from scripts.bench import command_buffer_log
from scripts.bench import gc_pauses
from scripts.bench import gpu_decode as bench_gpu_decode
from scripts.bench import harness
from scripts.bench import hosts as bench_hosts
from scripts.bench import input_stage_costs as bench_input_stage_costs
from scripts.bench import link as bench_link
from scripts.bench import peers as bench_peers
from scripts.bench import plot_profile as bench_plot_profile
from scripts.bench import step as bench_step
from scripts.bench import step_thread
from scripts.bench import train_input as bench_train_input
from scripts.bench import trainer_step
from scripts.render import benchmarks as render_benchmarks
from scripts.render import render
from tests.gpu_fakes import fake_gpu  # noqa: F401  pytest fixture

# Hand count for AlexNet-BN of width 3: kernels of conv1-5, fc6, fc7 (no bias before a BN) (7),
# scale and bias of the 8 BatchNorms (after each of those and after pool5) (16), fc8 kernel and
# bias (2).
ALEXNET_LEAVES = 25
# Its values at width 3 (convs 3/8/12/12/8 channels, fc 128 wide, 1000 classes): conv kernels
# 11*11*3*3 + 5*5*3*8 + 3*3*8*12 + 3*3*12*12 + 3*3*12*8, fc 288*128 + 128*128 + 128*1000 + 1000,
# BN 2 * (3 + 8 + 12 + 12 + 8 + 128 + 128 + 8).
ALEXNET_VALUES = 4713 + 182248 + 614


def _compile_cache(monkeypatch, tmp_path) -> None:
    """The test's child processes share a persistent compilation cache: a child that builds a
    program an earlier one compiled (same program and XLA flags) reads it instead of compiling.
    Of a multi-process run only process 0 writes and finds entries (JAX keys them per process).
    A cache the whole run shares (conftest.py's, or the caller's) is kept; else one of the test's
    own. Every program is cached, however quickly it compiled."""
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "compilation_cache"))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


# The trainer's AlexNet-BN at width 3 (`--override` of the benchmarks that run `jia_jax.main`):
# its step compiles in about half the time of the digits config's ResNet-18, and the assertions
# are about the benchmark's rows, not the model.
SMALL_MODEL_OVERRIDES = ("--override=--config.model.name=alexnet_bn",
                         "--override=--config.model.width=3")


def test_bench_allreduce_reports_every_strategy(tmp_path):
    out = tmp_path / "allreduce.json"
    doc = bench_allreduce.main(
        [
            "--tree_model=alexnet_bn",
            "--model_width=3",
            "--sizes_mib=0.01",
            "--bucket_mib=0.02",
            "--dtypes=bfloat16",
            "--meshes=2x4",
            "--repeats=3",
            "--min_sample_ms=0.1",
            f"--out={out}",
        ]
    )
    rows = doc["results"]
    assert not [r for r in rows if "error" in r or "skipped" in r]
    expected = {
        (payload, strategy)
        for payload in ("alexnet_bn", "flat 0.01M")
        for strategy in ("plain", *bench_allreduce.STRATEGIES)
    }
    assert {(r["payload"], r["strategy"]) for r in rows} == expected
    for r in rows:
        assert r["mesh"] == "2x4" and r["dtype"] == "bfloat16"
        # Exact identities of the derived figures (float64 arithmetic on the same numbers).
        # Device time of one reduction: the difference of 9 and 1 in-program iterations over 8.
        assert r["time_s"] == pytest.approx(
            (r["program_9_iterations_s"] - r["program_1_iteration_s"]) / 8, rel=1e-12
        )
        assert r["call_time_s"] == sorted(r["call_samples_s"])[1]  # median of 3
        assert r["busbw_gbps"] == pytest.approx(
            2 * 7 / 8 * r["payload_bytes"] / r["time_s"] / 1e9, rel=1e-12
        )
        # The ratio to the plain psum of the same payload and dtype. No sign is asserted: on a
        # 2-core CPU a 10 KiB reduction's t(9) - t(1) is within the timer's noise (it once came
        # out negative), and speed is for benchmarks, not tests.
        plain = next(p for p in rows if p["payload"] == r["payload"] and p["strategy"] == "plain")
        assert r["ratio"] == pytest.approx(plain["time_s"] / r["time_s"], rel=1e-12)
        assert math.isfinite(r["busbw_gbps"]) and math.isfinite(r["ratio"])
    tree = next(r for r in rows if r["payload"] == "alexnet_bn" and r["strategy"] == "flat")
    assert tree["leaves"] == ALEXNET_LEAVES
    assert tree["payload_bytes"] == 2 * ALEXNET_VALUES  # bf16 on the wire
    assert 1 < tree["buckets"] < ALEXNET_LEAVES  # 20 KiB buckets: fused, but not into one
    assert out.exists()


def test_bench_allreduce_payload_bytes_per_dtype():
    tree = bench_allreduce.Payload("t", {"a": (3, 5), "b": (7,)}, (64,))
    cases = bench_allreduce.build_cases(tree, [10485], ["float32", "bfloat16"], [(2, 4)], ["flat"])
    # Per dtype: the tree, then the flat buffer, each with plain + flat.
    assert [(c.dtype, c.payload.name, c.strategy) for c in cases] == [
        ("float32", "t", "plain"),
        ("float32", "t", "flat"),
        ("bfloat16", "t", "plain"),
        ("bfloat16", "t", "flat"),
        ("float32", "flat 0.01M", "plain"),
        ("float32", "flat 0.01M", "flat"),
        ("bfloat16", "flat 0.01M", "plain"),
        ("bfloat16", "flat 0.01M", "flat"),
    ]
    assert {c.payload.num_elements() for c in cases if c.payload.name == "t"} == {22}
    # A flat buffer keeps its bytes (whole elements of the wire dtype) and is one bucket.
    flat = {c.dtype: c.payload for c in cases if c.payload.name != "t"}
    assert flat["float32"].num_elements() == 2621 and flat["bfloat16"].num_elements() == 5242
    assert flat["float32"].bucket_bytes == (10484,) and flat["bfloat16"].bucket_bytes == (10484,)


def test_bench_allreduce_skips_past_budget(tmp_path):
    doc = bench_allreduce.main(
        [
            "--tree_model=",
            "--sizes_mib=0.01,0.02",
            "--dtypes=float32",
            "--budget_s=-1",
            f"--out={tmp_path / 'a.json'}",
        ]
    )
    # 2 payloads x 2 default meshes x (plain + 4 strategies), none measured.
    assert len(doc["results"]) == 20
    assert all(r["skipped"] and "time_s" not in r for r in doc["results"])


def test_bench_step_case_order_and_skip_rule():
    cases = bench_step.build_cases(["a", "b"], bench_step.MESHES, bench_step.STRATEGIES, [1, 4])
    # Per model: 1x1 xla; xla on 1xn; flat, hierarchical, hybrid x 2 buckets on 1xn; hierarchical
    # and hybrid x 2 buckets on 2xn/2 (xla and flat reduce over the same devices as on 1xn); the
    # peers on 1xn only: the two AD-placed ones unbucketed, the two concatenated-bucket ones
    # (fp32 and wire dtype) x 2; auto (unbucketed: the model picks) on both.
    assert len(cases) == 2 * (1 + 1 + 3 * 2 + 2 * 2 + 2 + 2 * 2 + 2)
    assert [(c.model, c.mesh) for c in cases[:4]] == [
        ("a", "1x1"),
        ("b", "1x1"),
        ("a", "1xn"),
        ("b", "1xn"),
    ]
    assert {c.strategy for c in cases if c.mesh == "2xn/2"} == {*bench_step.NODE_AWARE, "auto"}
    assert all(
        (c.bucket_mib is None)
        == (c.strategy in ("xla", "auto") or c.strategy.startswith("peer_ad"))
        for c in cases
    )


def test_bench_step_measures_the_train_step(tmp_path, monkeypatch):
    # The children inherit conftest.py's fast-compile XLA_FLAGS. The variant's flag repeats its
    # device count (a no-op, as the fast-compile flag it replaces had become) and JAX leaves it out
    # of its cache key: the variant's child reads the 2x4 step the first child compiled.
    _compile_cache(monkeypatch, tmp_path)
    flags = "--xla_force_host_platform_device_count=8"
    doc = bench_step.main(
        [
            "--models=alexnet_bn",
            "--model_width=3",
            "--small_inputs",
            "--image_size=16",
            "--compute_dtype=float32",  # compiles in half the time of bf16 on CPU
            "--per_device_batch=2",
            "--meshes=1x1,2xn/2",
            "--strategies=hierarchical",
            "--bucket_mib=0.01",
            "--steps=2",
            "--warmup_steps=1",
            f"--xla_flags_variant={flags}",
            "--budget_s=900",
            f"--out={tmp_path / 's.json'}",
        ]
    )
    assert doc["environment"]["device_count"] == 8
    assert doc["environment"]["jax_version"] == jax.__version__
    rows = {(r["mesh_shape"], r["strategy"]): r for r in doc["results"]}
    assert set(rows) == {("1x1", "xla"), ("2x4", "hierarchical")}
    for r in rows.values():
        assert r["step_time_s"] > 0 and math.isfinite(r["loss"])
        assert r["global_batch"] == 2 * r["devices"]
        assert r["images_per_s"] == pytest.approx(r["global_batch"] / r["step_time_s"], rel=1e-12)
        # Weak scaling: efficiency is the inverse of the step-time ratio to the 1x1 row.
        assert r["efficiency"] == pytest.approx(1 / r["step_time_ratio"], rel=1e-12)
        assert math.isfinite(r["efficiency"]) and r["efficiency"] > 0
    assert rows[("1x1", "xla")]["efficiency"] == 1.0
    assert rows[("1x1", "xla")]["collectives"] == {}
    # The hierarchical step really is reduce-scatter + all-gather around a cross-node all-reduce.
    hierarchical = rows[("2x4", "hierarchical")]["collectives"]
    assert hierarchical.get("reduce-scatter", 0) > 0 and hierarchical.get("all-gather", 0) > 0
    [variant] = doc["variants"]
    assert variant["xla_flags"] == flags
    assert (variant["mesh_shape"], variant["strategy"]) == ("2x4", "hierarchical")
    assert math.isfinite(variant["speedup_vs_default"]) and variant["speedup_vs_default"] > 0


def test_bench_step_survives_crashing_workers(tmp_path, monkeypatch):
    # Every child aborts at start-up (XLA rejects the flag): each case is charged to the child that
    # died on it, a new child takes the next, and the run still ends with a complete report.
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} --xla_no_such_flag=1")
    out = tmp_path / "s.json"
    doc = bench_step.main(
        [
            "--models=alexnet_bn",
            "--meshes=1x1,1xn",
            "--strategies=xla",
            "--budget_s=300",
            f"--out={out}",
        ]
    )
    assert [(r["mesh"], r["strategy"]) for r in doc["results"]] == [("1x1", "xla"), ("1xn", "xla")]
    assert all("worker exited with status" in r["error"] for r in doc["results"])
    assert doc["variants"] == [] and out.exists()


def test_bench_peers_rates_the_trainer_and_its_variants_against_the_plain_flax_step(tmp_path):
    """A model-option row and an XLA-flag row (the command-buffer flag of scripts/bench_1gpu.sh:
    XLA aborts on a flag value it does not know) next to the trainer and the flax step."""
    flags = "--xla_gpu_enable_command_buffer=+CONVOLUTION"
    doc = bench_peers.main(
        [
            "--models=alexnet_bn",  # compiles several times faster than a ResNet-50 on CPU
            "--kinds=trainer,flax",
            "--batches=2",
            "--image_size=16",
            "--model_width=3",
            "--small_inputs",
            "--compute_dtype=float32",  # compiles in half the time of bf16 on CPU
            "--steps=3",
            "--warmup_steps=1",
            "--model_options=sliced_max_pool",
            f"--xla_flags_variant={flags}",
            f"--out={tmp_path / 'p.json'}",
        ]
    )
    rows = doc["results"]
    assert not [r for r in rows if "error" in r or "skipped" in r], rows
    # The flag variant first (a child of its own), then the trainer, flax and the option set.
    assert [(r["kind"], bench_peers.variant(r)) for r in rows] == [
        ("trainer", flags),
        ("trainer", ""),
        ("flax", ""),
        ("trainer", "sliced_max_pool"),
    ]
    for r in rows:
        assert r["images_per_s"] == pytest.approx(2 / r["step_time_s"], rel=1e-12)
        assert r["step_time_s"] == statistics.median(r["samples_s"])
    variant, trainer, flax, option = rows
    for r in (variant, trainer, option):
        assert r["ratio_vs_faster_peer"] == pytest.approx(
            r["images_per_s"] / flax["images_per_s"], rel=1e-12
        )
    for r in (variant, option):
        assert r["speedup_vs_trainer"] == pytest.approx(
            r["images_per_s"] / trainer["images_per_s"], rel=1e-12
        )
    assert "ratio_vs_faster_peer" not in flax and "speedup_vs_trainer" not in trainer
    assert doc["environment"]["device_count"] >= 1
    table = render(str(tmp_path / "p.json"))
    assert "| alexnet_bn | 2 | trainer | sliced_max_pool |" in table and "vs trainer" in table


def test_bench_peers_flax_step_keeps_the_plain_layers_whatever_the_defaults():
    # The default config turns the layer options on; the peer they are measured against must
    # not take them (it did, once they became the defaults: trainer and "plain" peer then ran
    # the same layers).
    args = argparse.Namespace(
        image_size=224, model_width=None, small_inputs=False, compute_dtype="bfloat16"
    )
    for model in ("resnet50", "alexnet_bn"):
        case = {"model": model, "per_device_batch": 2}
        flax = bench_peers.case_config({**case, "kind": "flax"}, args).model
        assert not flax.space_to_depth_stem and not flax.sliced_max_pool, model
    trainer = bench_peers.case_config({"model": "resnet50", "per_device_batch": 2,
                                       "kind": "trainer"}, args).model
    assert trainer.space_to_depth_stem and trainer.sliced_max_pool  # the defaults, untouched
    option = bench_peers.case_config({"model": "resnet50", "per_device_batch": 2,
                                      "kind": "trainer", "model_options": ["no_sliced_max_pool"]},
                                     args).model
    assert option.space_to_depth_stem and not option.sliced_max_pool


def test_bench_peers_measures_each_compute_dtype_against_its_own_peers():
    # Rows per dtype, side by side; the variants in the first; torch (bf16 autocast) is a peer of
    # the bf16 rows only.
    args = bench_peers.parse_args(
        ["--models=resnet50", "--batches=64", "--compute_dtype=bfloat16,float16",
         "--model_options=sliced_max_pool"]
    )
    cases = bench_peers.build_cases(args)
    assert [(c["kind"], c["compute"], bench_peers.variant(c)) for c in cases] == [
        ("torch", "bfloat16", ""),
        ("trainer", "bfloat16", ""),
        ("flax", "bfloat16", ""),
        ("trainer", "float16", ""),
        ("flax", "float16", ""),
        ("trainer", "bfloat16", "sliced_max_pool"),
    ]
    fp16 = bench_peers.case_config(cases[3], args)
    assert fp16.precision.compute == "float16" and fp16.model.sliced_max_pool
    rates = [100.0, 110.0, 90.0, 120.0, 60.0, 121.0]
    rows = [{**c, "images_per_s": r} for c, r in zip(cases, rates, strict=True)]
    bench_peers.add_ratios(rows)
    assert rows[1]["ratio_vs_faster_peer"] == 110.0 / 100.0
    assert rows[3]["ratio_vs_faster_peer"] == 120.0 / 60.0  # not against bf16's torch (100)
    assert rows[5]["speedup_vs_trainer"] == 121.0 / 110.0  # the bf16 trainer's
    doc = {"environment": harness.environment(), "results": rows}
    for r in rows:
        r["synced_images_per_s"] = r["images_per_s"]
    table = render_benchmarks.peers_table(doc)
    assert "compute dtype as listed" in table
    assert "| resnet50 | 64 | float16 | trainer |  | 120 | 120 | 2.000 | |" in table


def test_profile_step_names_a_case_of_another_compute_dtype(tmp_path):
    # A case that fails at once (no such model) still carries the dtype in its row and its key.
    from scripts.bench import profile_step

    out = tmp_path / "p.json"
    rows = profile_step.main(
        ["--cases=no_such_model:1x1:xla:2", "--compute_dtype=float16", f"--out={out}"]
    )
    assert rows[0]["variant"] == "float16" and "error" in rows[0]
    with gzip.open(f"{out}.kernels.json.gz", "rt") as f:
        assert list(json.load(f)) == ["no_such_model:1x1:xla:2 (float16)"]


def test_trainer_progress_reads_every_logged_interval():
    # The trainer pads the step to the width of the total ("step  40/240"): every line counts.
    log = "\n".join(
        [
            "I1126 loop.py:204] step  40/240 | learning_rate 0.1 | loss 6.7 | 420.7 img/s | ETA 0:04:03",
            "I1126 loop.py:204] step 120/240 | learning_rate 0.04 | loss 6.6 | 8408.0 img/s | ETA 0:00:07",
            "unrelated line | 5.0 img/s |",
        ]
    )
    assert [(p["step"], p["images_per_s"]) for p in harness.trainer_progress(log)] == [
        (40, 420.7),
        (120, 8408.0),
    ]


def test_trainer_progress_reads_the_input_wait_and_lines_without_it():
    # Lines as jia_jax.metrics writes them (the trainer's metrics start with the learning rate),
    # and one of a trainer from before input wait was logged: its rate is still read, its wait
    # is None.
    def line(step, rate, wait):
        measured = metrics.Throughput(rate / 256, rate, 10.0, wait)
        values = {"learning_rate": 0.1, "loss": 2.5}
        return "I0 loop.py:300] " + metrics.format_progress(step, 1000, values, measured)

    old = "I0 loop.py] step  150/1000 | learning_rate 0.1 | loss 6.7 | 420.7 img/s | ETA 0:04:03"
    log = "\n".join([line(50, 1280.0, 0.25), line(100, 2560.0, 0.034), old])
    assert "| 1280.0 img/s | input wait 25% | ETA 0:00:10" in log  # the format read here
    progress = harness.trainer_progress(log)
    assert [(p["step"], p["images_per_s"], p["input_wait"]) for p in progress] == [
        (50, 1280.0, 0.25),
        (100, 2560.0, 0.03),  # the line's integer percent: 3.4% prints as 3
        (150, 420.7, None),
    ]


def test_trainer_progress_reads_the_gpu_paths_input_stages():
    measured = metrics.Throughput(10.0, 2560.0, 10.0, 0.5, {"read": 31.25, "decode": 4.0})
    values = {"learning_rate": 0.1, "loss": 2.5}
    log = "I0 loop.py:300] " + metrics.format_progress(50, 1000, values, measured)
    assert "| input wait 50% (read 31.2, decode 4 ms a batch) | ETA" in log  # the format read
    (progress,) = harness.trainer_progress(log)
    assert progress["input_wait"] == 0.5
    assert progress["input_stages_ms"] == {"read": 31.2, "decode": 4.0}


def test_trainer_progress_reads_the_launch_time_after_either_input_wait():
    values = {"learning_rate": 0.1, "loss": 2.5}
    plain = metrics.Throughput(10.0, 2560.0, 10.0, 0.25, launch_ms=8.04)
    staged = metrics.Throughput(10.0, 2560.0, 10.0, 0.5, {"decode": 4.0}, launch_ms=12.96)
    old = "I0 loop.py] step  150/1000 | lr 1 | loss 6.7 | 420.7 img/s | input wait 3% | ETA 0:04:03"
    log = "\n".join(
        "I0 loop.py:300] " + metrics.format_progress(step, 1000, values, measured)
        for step, measured in ((50, plain), (100, staged))
    ) + "\n" + old
    assert "| input wait 25% | launch 8.0 ms a step | ETA" in log  # the format read
    # The line's one decimal; a line from before the field was logged has none.
    assert [p.get("launch_ms") for p in harness.trainer_progress(log)] == [8.0, 13.0, None]


def test_bench_train_input_input_wait_is_the_median_after_the_first_interval():
    progress = [{"input_wait": w} for w in (0.9, 0.1, 0.5, 0.3)]
    # The first interval (compilation, the workers' start) is left out: median of 0.1, 0.5, 0.3.
    assert bench_train_input.steady_median(progress, "input_wait") == 0.3
    assert bench_train_input.steady_median([{"input_wait": None}] * 3, "input_wait") is None


def test_trainer_progress_counts_each_step_of_several_processes_once():
    # Both processes of scripts/launch_local.sh log each step's global rate (recorded on CPU,
    # 2 x 4 devices): each step counts once, and the steady intervals are steps 4 and 6 alone.
    log = "\n".join(
        [
            "I1127 06:38:28.360260 140225232341888 loop.py:294] step 2/6 | learning_rate 0.02333 | loss 6.869 | top1 0 | 53.4 img/s | ETA 0:00:01",
            "I1127 06:38:28.361204 139867474795392 loop.py:294] step 2/6 | learning_rate 0.02333 | loss 6.869 | top1 0 | 52.6 img/s | ETA 0:00:01",
            "I1127 06:38:28.911148 140225232341888 loop.py:294] step 4/6 | learning_rate 0.0125 | loss 6.776 | top1 0.125 | 57.9 img/s | ETA 0:00:01",
            "I1127 06:38:28.916051 139867474795392 loop.py:294] step 4/6 | learning_rate 0.0125 | loss 6.776 | top1 0.125 | 57.7 img/s | ETA 0:00:01",
            "I1127 06:38:29.518434 140225232341888 loop.py:294] step 6/6 | learning_rate 0.001675 | loss 6.709 | top1 0.125 | 52.7 img/s | ETA 0:00:00",
            "I1127 06:38:29.525600 139867474795392 loop.py:294] step 6/6 | learning_rate 0.001675 | loss 6.709 | top1 0.125 | 52.5 img/s | ETA 0:00:00",
        ]
    )
    progress = harness.trainer_progress(log)
    assert [(p["step"], p["images_per_s"]) for p in progress] == [(2, 53.4), (4, 57.9), (6, 52.7)]
    assert statistics.median(p["images_per_s"] for p in progress[1:]) == pytest.approx(55.3)


def test_bench_train_input_compares_real_jpegs_with_synthetic_data(tmp_path, monkeypatch):
    """The whole script on CPU (8 devices, 2x4) with a tiny model: both runs train and the ratio
    is their quotient."""
    from absl import flags

    from scripts.bench import input as bench_input

    flags.FLAGS.mark_as_parsed()
    bench_input.prepare(str(tmp_path), 24, "array_record")
    # The host run reads the synthetic run's init and checkpoint programs (its step takes uint8
    # images and is compiled anew).
    _compile_cache(monkeypatch, tmp_path)
    out = tmp_path / "out.json"
    doc = bench_train_input.main(
        [
            f"--data_dir={tmp_path}",
            "--config=configs/digits.py",
            "--override=--config.data.image_size=16",
            *SMALL_MODEL_OVERRIDES,
            "--per_gpu=2",
            "--steps=6",
            "--log_every=2",
            "--num_workers=0",
            f"--out={out}",
        ]
    )
    rows = {r["variant"]: r for r in doc["results"]}
    assert set(rows) == {"synthetic", "host"}, rows
    for r in rows.values():
        assert r["returncode"] == 0 and [s for s, _ in r["intervals"]] == [2, 4, 6], r["log_tail"]
        # The trainer logs each interval's wait; the row holds a fraction, not the percent.
        assert 0.0 <= r["input_wait"] <= 1.0, r
    ratio = rows["host"]["images_per_s"] / rows["synthetic"]["images_per_s"]
    assert rows["host"]["ratio_vs_synthetic"] == pytest.approx(ratio)
    assert json.loads(out.read_text())["results"][1]["variant"] == "host"
    assert doc["processes"] == 1


def test_bench_train_input_command_of_several_processes():
    """With --processes the local launcher starts the trainers, each GPUs / processes of them
    and its share of the workers; the launcher alone sets the mesh and the distributed flags.
    With --launcher=main, main starts them and shares out the workers; one process is one."""
    args = argparse.Namespace(
        config="configs/resnet50_64k.py", per_gpu=256, steps=100, log_every=20, override=[],
        data_dir="/data", num_workers=16, processes=2, launcher="launch_local", gc_log=False,
    )
    cmd = bench_train_input.command("gpu", args, 4, "/w")
    assert cmd[:6] == ["bash", "scripts/launch_local.sh", "2", "2", "configs/resnet50_64k.py", "/w"]
    assert cmd[6:] == bench_train_input.config_flags("gpu", args, 4)
    assert "--config.global_batch_size=1024" in cmd and "--config.data.num_workers=8" in cmd
    assert not [a for a in cmd if a.startswith(("--config.mesh.", "--config.distributed."))]
    args.launcher = "main"
    by_main = bench_train_input.command("gpu", args, 2, "/w")
    assert by_main[1:3] == ["-m", "jia_jax.main"] and "--config.data.num_workers=16" in by_main
    assert not [a for a in by_main if a.startswith(("--config.mesh.", "--config.distributed."))]
    args.processes = 1
    one = bench_train_input.command("gpu", args, 4, "/w")
    assert one[1:3] == ["-m", "jia_jax.main"] and "--config.data.num_workers=16" in one
    assert "--config.distributed.process_per_gpu=never" in one  # one process, on any data


def test_bench_train_input_records_the_processes_main_started(tmp_path, monkeypatch):
    logs = iter(["Training as 2 processes of one GPU each (distributed.process_per_gpu='auto')",
                 "no split"])
    monkeypatch.setattr(harness, "run_logged", lambda cmd, env, **_: (0, next(logs)))
    monkeypatch.setattr(bench_train_input, "_visible_gpus", lambda: 2)
    doc = bench_train_input.main(["--variants=gpu,gpu", "--processes=2", "--launcher=main",
                                  f"--out={tmp_path / 'o.json'}"])
    assert [r["started"] for r in doc["results"]] == [2, 1]
    assert doc["launcher"] == "main"
    monkeypatch.setattr(bench_train_input, "_visible_gpus", lambda: 4)
    with pytest.raises(SystemExit, match="give --processes=4"):
        bench_train_input.main(["--processes=2", "--launcher=main"])


def test_bench_train_input_xla_flags_reach_only_the_trainers(tmp_path, monkeypatch):
    envs = []
    monkeypatch.setattr(harness, "run_logged", lambda cmd, env, **_: (envs.append(env), (1, ""))[1])
    own = os.environ["XLA_FLAGS"]  # conftest.py's: an unknown flag would abort this process
    bench_train_input.main(["--variants=synthetic", "--xla_flags=--xla_gpu_graph_min_graph_size=1",
                            f"--out={tmp_path / 'o.json'}"])
    [env] = envs
    assert env["XLA_FLAGS"].split() == [*own.split(), "--xla_gpu_graph_min_graph_size=1"]
    assert os.environ["XLA_FLAGS"] == own  # this process's own left as they were


def _xla_update_lines(moved: int, commands: int, skipped: int, us: int) -> str:
    """One command-buffer update as XLA logs it at the verbosity command_buffer_log.ENV sets (the
    wording of jax 0.11.2's XLA)."""
    return (
        "I1130 18:23:01.748957    4385 command_buffer_thunk.cc:336] [0] Create/Update command "
        "buffer by recoding command buffer cmd sequence after 1 executions since last update; "
        f"num_commands={commands}; updated_allocs={moved}; is_first_record=false; "
        "needs_update=true\n"
        "I1130 18:23:01.748995    4385 command_executor.cc:546] Record update "
        f"{commands} commands into command buffer 0x57b89760: record_id=0\n"
        f"I1130 18:23:01.749067    4385 command_executor.cc:669] Updated {commands} commands in "
        f"{us} \u03bcs (skipped {skipped} command updates)\n"
        "I1130 18:23:01.749074    4385 command_buffer_thunk.cc:362] [0] Updated command buffer "
        f"in {us + 16} \u03bcs; num_commands={commands}\n"
    )


def test_command_buffer_log_counts_the_updates_a_step_after_the_first_interval():
    # Compilation and warm-up (before the first progress line) record everything: left out.
    warmup = _xla_update_lines(9, 1200, 0, 90000)
    first = "I1130 loop.py:326] step 100/300 | learning_rate 0.1 | loss 2.1 | 5763.1 img/s |\n"
    steady = [(5, 1200, 100, 2000), (1, 1200, 1190, 40), (5, 1200, 300, 1800)]
    last = "I1130 loop.py:326] step 300/300 | learning_rate 0.1 | loss 2.0 | 5763.1 img/s |\n"
    evals = _xla_update_lines(7, 300, 0, 9000)  # the final eval's program: left out too
    log = warmup + first + "".join(_xla_update_lines(*u) for u in steady) + last + evals
    # Over 4 steps: 3 updates, 1100 + 10 + 900 commands recorded again, 100 + 1190 + 300
    # skipped, 3840 us recording; the median update moved 5 allocations.
    assert command_buffer_log.summary(log, steps=4) == {
        "updates_per_step": 0.75,
        "moved_allocations_median": 5,
        "recorded_per_step": 502.5,
        "skipped_per_step": 397.5,
        "record_us_per_step": 960.0,
    }
    assert command_buffer_log.summary(warmup + first, steps=4) is None  # no steady update


def test_bench_train_input_command_buffer_log_asks_xla_and_reads_its_lines(tmp_path, monkeypatch):
    envs = []
    log = "".join(
        f"I1130 loop.py:326] step {s}/30 | learning_rate 0.1 | loss 1 | 100.0 img/s | ETA 0:00:01\n"
        + _xla_update_lines(4, 1000, 200, 1500)
        for s in (10, 20, 25, 30)
    )
    monkeypatch.setattr(harness, "run_logged",
                        lambda cmd, env, **_: (envs.append(env), (0, log))[1])
    monkeypatch.setattr(bench_train_input, "_visible_gpus", lambda: 1)
    doc = bench_train_input.main(["--variants=synthetic,gpu", "--command_buffer_log",
                                  f"--out={tmp_path / 'o.json'}"])
    assert all(env[k] == v for env in envs for k, v in command_buffer_log.ENV.items())
    # Three updates between the first and last intervals' lines, over their 20 steps.
    for row in doc["results"]:
        assert row["command_buffer_updates"]["recorded_per_step"] == pytest.approx(3 * 800 / 20)
    plain = bench_train_input.main(["--variants=synthetic", f"--out={tmp_path / 'p.json'}"])
    assert "command_buffer_updates" not in plain["results"][0]
    assert envs[-1].get("TF_CPP_VMODULE") == os.environ.get("TF_CPP_VMODULE")  # as it was


def test_bench_train_input_gc_log_wraps_the_trainer_and_reads_its_passes(tmp_path, monkeypatch):
    """--gc_log runs jia_jax.main under scripts/bench/gc_pauses.py (--unfrozen passed on), its
    passes summarised over the log's steady window; refused with several processes, and
    --gc_unfrozen refused alone."""
    log = "".join(f"I1130 10:00:{s:02d}.000000 1 loop.py:326] step {n}/30 | learning_rate 0.1 "
                  "| loss 1 | 100.0 img/s | ETA 0:00:01\n" for s, n in ((1, 10), (3, 20), (5, 30)))
    commands = []

    def ran(cmd, env, **_):
        commands.append(cmd)
        out = next(a.split("=", 1)[1] for a in cmd if a.startswith("--out="))
        with open(out, "w", encoding="utf-8") as f:  # a pass at 10:00:02, inside the window
            json.dump({"unfrozen": "--unfrozen" in cmd, "pauses": [[2.0, 2, 12.5]]}, f)
        return 0, log

    monkeypatch.setattr(harness, "run_logged", ran)
    monkeypatch.setattr(bench_train_input, "_visible_gpus", lambda: 1)
    monkeypatch.setattr(gc_pauses.thread_cpu, "local_seconds", lambda wall: 36000 + wall)
    doc = bench_train_input.main(["--variants=gpu", "--gc_log", "--gc_unfrozen",
                                  f"--out={tmp_path / 'o.json'}"])
    [cmd] = commands
    wrapper_end = cmd.index("--")
    assert cmd[1:3] == ["-m", "scripts.bench.gc_pauses"] and "--unfrozen" in cmd[:wrapper_end]
    assert cmd[wrapper_end + 1:wrapper_end + 3] == ["-m", "jia_jax.main"]
    gen2 = doc["results"][0]["gc_pauses"]["gen2"]
    assert (gen2["passes"], gen2["total_ms"], gen2["ms_per_s"]) == (1, 12.5, 12.5 / 4)
    for bad, why in ((["--gc_log", "--processes=2"], "--gc_log times one trainer process"),
                     (["--gc_unfrozen"], "give both")):
        with pytest.raises(SystemExit, match=why):
            bench_train_input.main(bad)


def test_bench_train_input_rates_two_processes_once(tmp_path, monkeypatch):
    """A real run of 2 processes of 4 CPU devices each: every step's interval counted once, the
    rate one of the global rates the trainers logged, and GPUs that the processes do not divide
    refused."""
    # The benchmark counts this process's 8 devices (conftest.py): the backend starts here,
    # before the children's device count is set.
    assert jax.local_device_count() == 8
    _cpu_processes(monkeypatch, 4)
    flags = ["--config=configs/digits.py", "--override=--config.data.image_size=16", "--per_gpu=2"]
    flags += SMALL_MODEL_OVERRIDES
    flags += ["--steps=6", "--log_every=2", "--variants=synthetic", f"--out={tmp_path / 'o.json'}"]
    doc = bench_train_input.main([*flags, "--processes=2"])
    [row] = doc["results"]
    assert row["returncode"] == 0 and [s for s, _ in row["intervals"]] == [2, 4, 6], row
    assert "scripts/launch_local.sh 2 4 configs/digits.py" in row["command"]
    logged = [float(line.split(" img/s")[0].rsplit("| ", 1)[1])
              for line in row["log_tail"] if "step 6/6" in line]
    assert len(logged) == 2, row["log_tail"]  # each process logged the step's global rate
    assert dict(row["intervals"])[6] in logged and doc["processes"] == 2
    with pytest.raises(SystemExit, match="--processes=3: must divide the 8 visible GPUs"):
        bench_train_input.main([*flags, "--processes=3"])


def test_bench_gpu_decode_smoke_stage_and_report_on_cpu(tmp_path, fake_gpu):  # noqa: F811
    """scripts/bench/gpu_decode.py on CPU, Pillow standing in for nvImageCodec: it writes the
    dataset, the smoke check finds the two paths within its bound, the decode stage times 1 and all 8 devices, and the
    report pairs each configuration's runs and renders."""
    common = [f"--data_dir={tmp_path}", "--num_images=16", "--image_size=32", "--canvas=128"]
    smoke = bench_gpu_decode.main(
        ["smoke", *common, "--images=16", "--batch=8", f"--out={tmp_path / 'smoke.json'}"]
    )
    assert smoke["examples"] == 16 and smoke["labels_equal"] and smoke["bound_holds"]
    assert smoke["refused_by_gpu_decoder"] == 0 and smoke["max_pixel_change"] <= 3
    decoded = {r["kind"]: r["decoded_on_gpu"] for r in smoke["odd_images"]}
    assert decoded == {
        "rgb": [True, True],
        "grey": [True, True],
        "cmyk": [False, False],
        "png": [False, False],
        "progressive": [True, True],  # the default backends, after the hardware refused it
        "truncated": [False, False],
    }
    stage_path = tmp_path / "stage.json"
    stage = bench_gpu_decode.main(
        ["decode", *common, "--per_gpu", "2", "--batches=1", "--repeats=1", "--depth", "1", "2",
         f"--out={stage_path}"]
    )
    assert [(r["per_gpu"], r["gpus"], r["depth"]) for r in stage["results"]] == [
        (2, 1, 1), (2, 8, 1), (2, 1, 2), (2, 8, 2)]
    assert all(r["decode_images_per_s"] > 0 for r in stage["results"])

    def train_input_run(path, variants, override=(), workers=8, xla_flags=None, **processes):
        # Records before --processes have no processes field.
        results = [{"variant": v, "images_per_s": rate} for v, rate in variants.items()]
        workers = 0 if "synthetic" in variants else workers
        args = {"per_gpu": 2, "override": list(override), "num_workers": workers}
        if xla_flags is not None:  # records before train_input's --xla_flags have none
            args["xla_flags"] = xla_flags
        doc = {"gpus": 8, "cores": 2, "args": args, "results": results, **processes}
        path.write_text(json.dumps(doc))
        return str(path)

    runs = [
        train_input_run(tmp_path / "synthetic.json", {"synthetic": 1000.0}),
        train_input_run(tmp_path / "gpu.json", {"gpu": 980.0}),
    ]
    out = tmp_path / "report.json"
    doc = bench_gpu_decode.main(["report", f"--stage={stage_path}", "--runs", *runs, f"--out={out}"])
    [row] = doc["results"]
    assert row["ratio"] == pytest.approx(0.98) and row["cores"] == 2
    assert row["decode_images_per_s"] == stage["results"][1]["decode_images_per_s"]
    table = render_benchmarks.table(str(out))
    assert "| 8 | 2 | 2 | 980 | 1,000 | 0.980 |" in table and "processes" not in table
    assert "input wait" not in table and "input_wait" not in row  # runs without the figure
    # Runs that logged the input wait: the GPU path's share in a column of its own.
    waited = json.loads(open(runs[1]).read())
    waited["results"][0]["input_wait"] = 0.25
    (tmp_path / "gpu_waited.json").write_text(json.dumps(waited))
    wait_runs = [runs[0], str(tmp_path / "gpu_waited.json")]
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *wait_runs, f"--out={out}"])
    assert doc["results"][0]["input_wait"] == 0.25
    table = render_benchmarks.table(str(out))
    assert "| decode stage images/s per GPU | input wait, decode=gpu |" in table
    assert "| 0.980 | " in table and " | 25% |" in table and "input thread" not in table
    # Runs that logged where the input thread waits: those in a column of their own.
    waited["results"][0]["input_stages_ms"] = {"read": 12.5, "decode": 30.0}
    (tmp_path / "gpu_waited.json").write_text(json.dumps(waited))
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *wait_runs, f"--out={out}"])
    assert doc["results"][0]["input_stages_ms"] == {"read": 12.5, "decode": 30.0}
    table = render_benchmarks.table(str(out))
    assert "| input wait, decode=gpu | input thread waits a batch, ms |" in table
    assert " | 25% | read 12.5, decode 30 |" in table and "launch" not in table
    # Runs that logged the host's time in the step's call: both runs' in a column of their own.
    waited["results"][0]["launch_ms"] = 17.85
    (tmp_path / "gpu_waited.json").write_text(json.dumps(waited))
    launched = json.loads(open(runs[0]).read())
    launched["results"][0]["launch_ms"] = 11.05
    (tmp_path / "synthetic_launched.json").write_text(json.dumps(launched))
    launch_runs = [str(tmp_path / "synthetic_launched.json"), wait_runs[1]]
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *launch_runs, f"--out={out}"])
    assert (doc["results"][0]["launch_ms"], doc["results"][0]["synthetic_launch_ms"]) == (
        17.85, 11.05)
    table = render_benchmarks.table(str(out))
    assert "| input thread waits a batch, ms | launch ms a step, decode=gpu / synthetic |" in table
    assert " | read 12.5, decode 30 | 17.9 / 11.1 |" in table  # 17.85 is 17.8500000000000014
    # Runs that sampled where the trainer's CPU went (--thread_cpu): both runs' shares kept.
    waited["results"][0]["thread_cpu"] = {"window_s": 5.0, "cpu_s_per_s": {"main thread": 0.9}}
    (tmp_path / "gpu_waited.json").write_text(json.dumps(waited))
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *launch_runs, f"--out={out}"])
    assert doc["results"][0]["thread_cpu"]["cpu_s_per_s"] == {"main thread": 0.9}
    assert "synthetic_thread_cpu" not in doc["results"][0]  # that run was not sampled
    # Runs that timed their garbage collector (--gc_log): kept beside the rate.
    waited["results"][0]["gc_pauses"] = {"window_s": 5.0, "gen2": {"passes": 1}}
    (tmp_path / "gpu_waited.json").write_text(json.dumps(waited))
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *launch_runs, f"--out={out}"])
    assert doc["results"][0]["gc_pauses"]["gen2"] == {"passes": 1}
    assert "synthetic_gc_pauses" not in doc["results"][0]
    assert " | read 12.5, decode 30 | 17.9 / 11.1 |" in render_benchmarks.table(str(out))
    # The GPU path as 2 processes, against the one-process synthetic run (no 2-process one).
    runs.append(train_input_run(tmp_path / "gpu_2proc.json", {"gpu": 1200.0}, processes=2))
    doc = bench_gpu_decode.main(["report", f"--stage={stage_path}", "--runs", *runs, f"--out={out}"])
    one, two = doc["results"]
    assert (one["processes"], one["synthetic_processes"], one["ratio"]) == (1, 1, pytest.approx(0.98))
    assert (two["processes"], two["synthetic_processes"]) == (2, 1) and "errors" not in two
    assert two["ratio"] == pytest.approx(1.2) and two["synthetic_images_per_s"] == 1000.0
    assert two["decode_images_per_s"] == row["decode_images_per_s"]
    table = render_benchmarks.table(str(out))
    assert "| GPUs | processes | CPU cores |" in table
    assert "| 8 | 1 | 2 | 2 | 980 | 1,000 | 0.980 |" in table
    assert "| 8 | 2 | 2 | 2 | 1,200 | 1,000 (1 process) | 1.200 |" in table
    # The 2 processes each on cores of its own (train_input --bind of commit 1cd1af4, which
    # docs/benchmarks/bench_gpu_decode_bind_2xH200.json records): a row of its own, against
    # the same synthetic run, and a column saying which rows' processes were bound.
    bound = json.loads(open(runs[-1]).read())
    bound["args"]["bind"] = True
    bound["results"][0]["images_per_s"] = 1250.0
    (tmp_path / "gpu_2proc_bound.json").write_text(json.dumps(bound))
    doc = bench_gpu_decode.main(["report", f"--stage={stage_path}", "--runs", *runs,
                                 str(tmp_path / "gpu_2proc_bound.json"), f"--out={out}"])
    assert [(r["processes"], r["bound"], r["ratio"]) for r in doc["results"]] == [
        (1, False, pytest.approx(0.98)), (2, False, pytest.approx(1.2)),
        (2, True, pytest.approx(1.25))]
    table = render_benchmarks.table(str(out))
    assert "| GPUs | processes | CPU cores | images per GPU | cores bound |" in table
    assert "| 8 | 2 | 2 | 2 | yes | 1,250 | 1,000 (1 process) | 1.250 |" in table
    assert "| 8 | 2 | 2 | 2 | no | 1,200 | 1,000 (1 process) | 1.200 |" in table
    # The 2 processes started by jia_jax.main itself (train_input --launcher=main): a row of
    # its own, saying so where main started them all; a run where it did not says that.
    by_main = [train_input_run(tmp_path / f"gpu_main_{n}.json", {"gpu": rate}, processes=2,
                               launcher="main") for n, rate in ((2, 1190.0), (1, 900.0))]
    for path, started in zip(by_main, (2, 1)):
        record = json.loads(open(path).read())
        record["results"][0]["started"] = started
        open(path, "w").write(json.dumps(record))
    doc = bench_gpu_decode.main(["report", f"--stage={stage_path}", "--runs", *runs, *by_main,
                                 f"--out={out}"])
    assert [(r["processes"], r.get("launcher"), r.get("started"), r["round"])
            for r in doc["results"]] == [(1, None, None, 1), (2, "launch_local", None, 1),
                                         (2, "main", 2, 1), (2, "main", 1, 2)]
    table = render_benchmarks.table(str(out))
    assert "| GPUs | processes | processes started by | CPU cores |" in table
    assert "| 8 | 1 | - | 2 | 2 | 1 | 980 |" in table
    assert "| 8 | 2 | launch_local.sh | 2 | 2 | 1 | 1,200 | 1,000 (1 process) |" in table
    assert "| 8 | 2 | jia_jax.main | 2 | 2 | 1 | 1,190 | 1,000 (1 process) |" in table
    assert "| 8 | 2 | jia_jax.main: did not | 2 | 2 | 2 | 900 |" in table
    # The synthetic run and the GPU path in turn (bench_gpu_decode.sh rounds): each GPU-path run
    # against its own round's synthetic run, not the first's.
    turns = [train_input_run(tmp_path / f"turn_{v}_{i}.json", {v: rate})
             for i, (v, rate) in enumerate([("synthetic", 1000.0), ("gpu", 970.0),
                                            ("synthetic", 1100.0), ("gpu", 1078.0)])]
    doc = bench_gpu_decode.main(["report", f"--stage={stage_path}", "--runs", *turns,
                                 f"--out={out}"])
    assert [(r["round"], r["synthetic_images_per_s"], r["ratio"]) for r in doc["results"]] == [
        (1, 1000.0, pytest.approx(0.97)), (2, 1100.0, pytest.approx(0.98))]
    # A one-process synthetic run with no GPU-path run beside it is only that row's baseline.
    only = [runs[0], runs[-1]]
    doc = bench_gpu_decode.main(["report", f"--stage={stage_path}", "--runs", *only, f"--out={out}"])
    assert [(r["processes"], r["ratio"]) for r in doc["results"]] == [(2, pytest.approx(1.2))]
    # Two decoders a GPU in turn: a row of its own, against the same synthetic run, beside the
    # decode stage's rate at that depth.
    deeper = train_input_run(tmp_path / "gpu_depth2.json", {"gpu": 990.0},
                             override=["--config.data.gpu_decode_depth=2"])
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *runs[:2], deeper, f"--out={out}"])
    assert [(r["depth"], r["ratio"]) for r in doc["results"]] == [
        (1, pytest.approx(0.98)), (2, pytest.approx(0.99))]
    assert doc["results"][1]["decode_images_per_s"] == stage["results"][3]["decode_images_per_s"]
    table = render_benchmarks.table(str(out))
    assert "| GPUs | CPU cores | images per GPU | decode depth |" in table
    assert "| 8 | 2 | 2 | 2 | 990 | 1,000 | 0.990 |" in table
    assert "crop kernel" not in table and "round" not in table  # one kernel, one round
    assert f"data.gpu_crop_kernel={crop_resize.DEFAULT_KERNEL};" in table  # the runs' default
    # A data field in turn, two rounds each (bench_gpu_decode.sh kernels and chroma): a row per
    # value and round, each against the one synthetic run; the setting and round in columns.
    def in_turns(field, turns):
        paths = [
            train_input_run(tmp_path / f"gpu_{field}_{i}.json", {"gpu": rate},
                            override=[f"--config.data.{field}={value}"])
            for i, (value, rate) in enumerate(turns)
        ]
        doc = bench_gpu_decode.main(
            ["report", f"--stage={stage_path}", "--runs", runs[0], *paths, f"--out={out}"])
        return doc["results"], render_benchmarks.table(str(out))

    rows, table = in_turns(
        "gpu_crop_kernel", [("pallas", 970.0), ("pallas", 975.0), ("xla", 960.0), ("xla", 965.0)])
    assert [(r["crop_kernel"], r["round"], r["ratio"]) for r in rows] == [
        ("pallas", 1, pytest.approx(0.97)), ("pallas", 2, pytest.approx(0.975)),
        ("xla", 1, pytest.approx(0.96)), ("xla", 2, pytest.approx(0.965))]
    assert "| GPUs | CPU cores | images per GPU | crop kernel | round |" in table
    assert "| 8 | 2 | 2 | pallas | 2 | 975 | 1,000 | 0.975 |" in table
    assert "input workers" not in table and "chroma" not in table  # 8 each, interpolated
    # Chroma interpolated and repeated, as the override may spell them.
    spellings = [("True", 960.0), ("False", 980.0), ("'true'", 962.0), ("0", 985.0)]
    rows, table = in_turns("gpu_fancy_upsampling", spellings)
    assert [(r["chroma"], r["round"], r["ratio"]) for r in rows] == [
        ("interpolated", 1, pytest.approx(0.96)), ("interpolated", 2, pytest.approx(0.962)),
        ("repeated", 1, pytest.approx(0.98)), ("repeated", 2, pytest.approx(0.985))]
    assert "| GPUs | CPU cores | images per GPU | chroma | round |" in table
    assert "| 8 | 2 | 2 | repeated | 2 | 985 | 1,000 | 0.985 |" in table
    # nvJPEG's buffers grown and sized up front (bench_gpu_decode.sh prealloc), options quoted.
    sized = "nvjpeg_hw_decoder:preallocate_batch_size=2 nvjpeg_hw_decoder:preallocate_width_hint=9"
    rows, table = in_turns("gpu_decoder_options", [("''", 950.0), (f"'{sized}'", 990.0)])
    assert [(r["decoder_options"], r["ratio"]) for r in rows] == [
        ("", pytest.approx(0.95)), (sized, pytest.approx(0.99))]
    assert "| GPUs | CPU cores | images per GPU | decoder options |" in table
    assert f"| 8 | 2 | 2 | {sized} | 990 | 1,000 | 0.990 |" in table
    # Record-reading workers in turn (bench_gpu_decode.sh workers): a row per count and round,
    # each against the one synthetic run (which has no workers); the count in a column.
    turns = [(8, 950.0), (4, 940.0), (8, 955.0), (4, 945.0)]
    worker_runs = [
        train_input_run(tmp_path / f"gpu_w{workers}_{i}.json", {"gpu": rate}, workers=workers)
        for i, (workers, rate) in enumerate(turns)
    ]
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", runs[0], *worker_runs, f"--out={out}"])
    assert [(r["workers"], r["round"], r["ratio"]) for r in doc["results"]] == [
        (4, 1, pytest.approx(0.94)), (4, 2, pytest.approx(0.945)),
        (8, 1, pytest.approx(0.95)), (8, 2, pytest.approx(0.955))]
    table = render_benchmarks.table(str(out))
    assert "| GPUs | CPU cores | images per GPU | input workers | round |" in table
    assert "| 8 | 2 | 2 | 4 | 2 | 945 | 1,000 | 0.945 |" in table
    # XLA flags given to the trainers (bench_gpu_decode.sh xla_flags): the GPU path with them
    # against the synthetic run given the same, not the one without; flags in a column.
    skip = "--xla_gpu_command_buffer_update_mode=SKIP_TEMP"
    flag_runs = [
        train_input_run(tmp_path / f"flags_{i}.json", {variant: rate}, xla_flags=flags)
        for i, (variant, flags, rate) in enumerate([
            ("synthetic", "", 1000.0), ("synthetic", skip, 1100.0),
            ("gpu", skip, 1089.0), ("gpu", "", 900.0)])
    ]
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *flag_runs, f"--out={out}"])
    assert [(r.get("xla_flags"), r["synthetic_images_per_s"], r["ratio"])
            for r in doc["results"]] == [(None, 1000.0, pytest.approx(0.9)),
                                         (skip, 1100.0, pytest.approx(0.99))]
    table = render_benchmarks.table(str(out))
    assert "| GPUs | CPU cores | images per GPU | trainers' XLA flags |" in table
    assert f"| 8 | 2 | 2 | {skip} | 1,089 | 1,100 | 0.990 |" in table
    assert "| 8 | 2 | 2 | - | 900 | 1,000 | 0.900 |" in table
    # XLA's updates of the step's command buffers (train_input --command_buffer_log): each run's
    # commands recorded again a step, the GPU path's beside its synthetic run's.
    for path, recorded in ((flag_runs[0], 40.0), (flag_runs[3], 1180.0)):
        record = json.loads(open(path).read())
        record["results"][0]["command_buffer_updates"] = {"recorded_per_step": recorded}
        open(path, "w").write(json.dumps(record))
    doc = bench_gpu_decode.main(
        ["report", f"--stage={stage_path}", "--runs", *flag_runs, f"--out={out}"])
    plain = doc["results"][0]
    assert plain["command_buffer_updates"]["recorded_per_step"] == 1180.0
    assert plain["synthetic_command_buffer_updates"]["recorded_per_step"] == 40.0
    table = render_benchmarks.table(str(out))
    assert "| commands recorded again a step, decode=gpu / synthetic |" in table
    lines = {line.split(" | ")[3]: line for line in table.splitlines() if line.startswith("| 8 ")}
    assert lines["-"].endswith("| 1,180 / 40 |")
    assert lines[skip].endswith("| - / - |")  # runs without the log


def test_bench_gpu_decode_whole_image_rate_is_the_best_call_and_names_its_format(monkeypatch):
    clock = iter([0.0, 0.03, 1.0, 1.01, 2.0, 2.02])  # calls of 30, 10 and 20 ms
    monkeypatch.setattr(bench_gpu_decode.time, "perf_counter", lambda: next(clock))
    calls = []
    rate = bench_gpu_decode._best_rate(lambda: calls.append(1), 64, 3)
    assert len(calls) == 3 and rate == pytest.approx(64 / 0.01)  # the best call, not the mean
    monkeypatch.undo()
    stage = {"results": [{"per_gpu": 64, "gpus": 1, "whole_image_decode_images_per_s": 7000.0},
                         {"per_gpu": 64, "gpus": 1, "sample_format": "I_RGBA",
                          "whole_image_decode_images_per_s": 9000.0},
                         {"per_gpu": 64, "gpus": 1, "sample_format": "I_RGB", "error": "x"}]}
    row = {"gpus": 1, "cores": 16, "per_gpu": 64, "images_per_s": 4000.0, "ratio": 0.8,
           "synthetic_images_per_s": 5000.0, "decode_images_per_s": 8000.0}
    table = render_benchmarks.gpu_decode_table(
        {"decode_stage": stage, "results": [row], "environment": {
            "device_count": 1, "device_kind": "GPU", "jax_version": "0", "xla_flags": ""}})
    assert "64 per call, one GPU: 7,000 images/s." in table  # records from before the formats
    assert "64 per call, one GPU, into I_RGBA: 9,000 images/s." in table
    assert "I_RGB:" not in table  # a failed format has no rate to show


def test_bench_gpu_decode_loaded_on_cpu(tmp_path, fake_gpu):  # noqa: F811
    """The `loaded` mode times the decode stage alone and beside training, per decoder options
    (which reach the library), and the training runs only in the rows beside it."""
    doc = bench_gpu_decode.main(
        ["loaded", f"--data_dir={tmp_path}", "--num_images=16", "--image_size=32",
         "--canvas=128", "--per_gpu", "4", "--batches=1", "--repeats=2", "--tiny_model",
         # AlexNet-BN in fp32 compiles in a third of the tiny bf16 ResNet-50's time, and trains
         # beside the decoder all the same.
         "--train_model=alexnet_bn", "--train_compute_dtype=float32",
         "--decoder_options", "", "a:b=1", f"--out={tmp_path / 'loaded.json'}"]
    )
    rows = doc["results"]
    assert [(r["decoder_options"], r["beside_training"]) for r in rows] == [
        ("", False), ("", True), ("a:b=1", False), ("a:b=1", True)
    ]
    assert fake_gpu.options[-1] == ":fancy_upsampling=1 a:b=1"
    assert all(r["decode_images_per_s"] > 0 for r in rows), rows
    assert [r["train_images_per_s"] > 0 for r in rows] == [False, True, False, True], rows
    for r in rows:  # every batch's rows decoded, within which the decoder's calls ran
        phases = r["ms_per_batch"]
        assert phases["decode_rows"] >= phases["nvimgcodec_decode"] > 0, phases
    table = render_benchmarks.table(str(tmp_path / "loaded.json"))
    assert table.count("| a:b=1 | yes |") == 1 and "nvimgcodec_decode ms" in table


def test_bench_gpu_decode_contention_on_cpu(tmp_path, fake_gpu):  # noqa: F811
    """The `contention` mode trains alone, then beside each load in turn, per round: every row
    has the step's rate and its launch, each load's row its own rate over the row's time (whole
    batches of 4 records read, or decoded, at least one)."""
    doc = bench_gpu_decode.main(
        ["contention", f"--data_dir={tmp_path}", "--num_images=16", "--image_size=32",
         "--canvas=128", "--per_gpu", "4", "--batches=1", "--repeats=1", "--tiny_model",
         "--train_model=alexnet_bn", "--train_compute_dtype=float32", "--rounds=2",
         "--load_seconds=0.5", "--loads", "records", "decode", "both",
         f"--out={tmp_path / 'contention.json'}"]
    )
    rows = doc["results"]
    loads = ["none", "records", "decode", "both"]
    assert [(r["round"], r["load"]) for r in rows] == [(0, "none")] + [
        (k, load) for k in (1, 2) for load in loads]
    assert not any("boundaries" in r or "decoder_options" in r for r in rows)
    for r in rows:
        assert r["seconds"] >= 0.5 and r["train_images_per_s"] > 0 and r["train_launch_ms"] > 0, r
        assert ("load_images_per_s" in r) == (r["load"] != "none"), r
        if r["load"] != "none":  # whole batches of 4, at least one, over the row's time
            assert r["load_images"] >= 4 and r["load_images"] % 4 == 0, r
            assert r["load_images_per_s"] == pytest.approx(r["load_images"] / r["seconds"])
    assert doc["seconds_per_row"] == 0.5


def test_gpu_decode_contention_traces_per_option(tmp_path, fake_gpu, monkeypatch):  # noqa: F811
    """With --trace_seconds each row traces its first seconds (the steps finished meanwhile; on
    CPU no GPU kernels, so no boundaries); with several --contention_options a decode row each,
    the options reaching the library; round 0 trains before the library made any decoder. Each
    trace starts and stops with the step paused and none in flight (a trace started while the
    step's thread launched failed the step on a GPU)."""
    made = []  # decoders the library had made when each row started
    row, training, traced = (bench_gpu_decode._contention_row, step_thread.training,
                             step_thread.traced_kernels)
    times, paused = [], []  # the step's times; whether it was paused at each trace's start, end

    def counted(*args, **kwargs):
        made.append(len(fake_gpu.options))
        return row(*args, **kwargs)

    @contextlib.contextmanager
    def kept(*args, **kwargs):
        with training(*args, **kwargs) as t:
            times.append(t)
            yield t

    def watched(call):
        def state():
            return not times[0].running and times[0].idle.is_set()
        paused.append(state())
        result = traced(call)
        paused.append(state())
        return result

    monkeypatch.setattr(bench_gpu_decode, "_contention_row", counted)
    monkeypatch.setattr(step_thread, "training", kept)
    monkeypatch.setattr(step_thread, "traced_kernels", watched)
    doc = bench_gpu_decode.main(
        ["contention", f"--data_dir={tmp_path}", "--num_images=16", "--image_size=32",
         "--canvas=128", "--per_gpu", "4", "--batches=1", "--repeats=1", "--tiny_model",
         "--train_model=alexnet_bn", "--train_compute_dtype=float32", "--rounds=1",
         "--load_seconds=0.6", "--trace_seconds=0.3", "--loads", "decode",
         "--contention_options", "", ":num_cuda_streams=4",
         f"--out={tmp_path / 'contention.json'}"]
    )
    rows = doc["results"]
    assert [(r["round"], r["load"], r.get("decoder_options")) for r in rows] == [
        (0, "none", None), (1, "none", None), (1, "decode", ""),
        (1, "decode", ":num_cuda_streams=4")]
    assert ":fancy_upsampling=1 :num_cuda_streams=4" in fake_gpu.options
    assert made[0] == 0 and made[1:] == [len(fake_gpu.options)] * 3
    for r in rows:
        assert r["traced_steps"] >= 1 and r["boundaries"] is None, r
        assert r["seconds"] >= 0.6, r  # the traced seconds, then the rest of the row
    assert paused == [True] * 2 * len(rows)
    # Rendered as the contention it is: a row each, with its options and traced steps.
    table = render_benchmarks.table(str(tmp_path / "contention.json"))
    lines = [line for line in table.splitlines() if line.startswith("| 4 |")]
    assert [line.split(" | ")[1:5] for line in lines] == [
        ["0", "none", "-", str(rows[0]["traced_steps"])],
        ["1", "none", "-", str(rows[1]["traced_steps"])],
        ["1", "decode", "-", str(rows[2]["traced_steps"])],
        ["1", "decode", ":num_cuda_streams=4", str(rows[3]["traced_steps"])]]
    assert lines[3].endswith(f" | {rows[3]['load_images_per_s']:,.0f} |")


class _FakeDecodeProcess:
    """Decodes 8 images a call, after the call's seconds; records its arguments and its close."""

    made: list["_FakeDecodeProcess"] = []

    def __init__(self, args, per_gpu):
        self.per_gpu, self.other_rate, self.calls, self.closed = per_gpu, args.other_rate, [], False
        _FakeDecodeProcess.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.closed = True

    def __call__(self, seconds):
        self.calls.append(seconds)
        time.sleep(seconds)
        return 8


def test_gpu_decode_contention_other_process_makes_no_decoder_here(tmp_path, fake_gpu,  # noqa: F811
                                                                    monkeypatch):
    """`--loads other` decodes in another process: this one never makes a decoder (one would
    change how its step's kernels follow one another for the rest of it); the row has the other
    process's images over the row's time, and the process is closed after the rows."""
    monkeypatch.setattr(bench_gpu_decode, "_DecodeProcess", _FakeDecodeProcess)
    _FakeDecodeProcess.made.clear()
    doc = bench_gpu_decode.main(
        ["contention", f"--data_dir={tmp_path}", "--num_images=16", "--image_size=32",
         "--canvas=128", "--per_gpu", "4", "--batches=1", "--repeats=1", "--tiny_model",
         "--train_model=alexnet_bn", "--train_compute_dtype=float32", "--rounds=2",
         "--load_seconds=0.4", "--loads", "other", "--other_rate=900",
         f"--out={tmp_path / 'contention.json'}"])
    rows = doc["results"]
    assert [(r["round"], r["load"]) for r in rows] == [
        (0, "none"), (1, "none"), (1, "other"), (2, "none"), (2, "other")]
    assert fake_gpu.options == []
    (child,) = _FakeDecodeProcess.made
    assert (child.per_gpu, child.other_rate, child.calls, child.closed) == (4, 900, [0.4] * 2, True)
    for r in rows[2::2]:
        assert r["load_images"] == 8 and r["load_images_per_s"] == pytest.approx(8 / r["seconds"])


def test_gpu_decode_contention_refuses_other_beside_decoders_here(tmp_path):
    with pytest.raises(SystemExit) as stopped:
        bench_gpu_decode.main(["contention", "--loads", "other", "decode",
                               f"--out={tmp_path / 'c.json'}"])
    assert stopped.value.code == 2


def test_gpu_decode_loop_decodes_per_line_paced(tmp_path, fake_gpu, monkeypatch,  # noqa: F811
                                               capsys):
    """`decode_loop` (the other process) says it is ready once its decoder has decoded a pass,
    then decodes for each line's seconds, whole batches, no more than --other_rate allows."""
    from scripts.bench import input as bench_input

    bench_input.prepare(str(tmp_path), 16, "array_record")
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("0.5\n0.5\n"))
    bench_gpu_decode.main(["decode_loop", f"--data_dir={tmp_path}", "--num_images=16",
                           "--image_size=32", "--canvas=128", "--per_gpu", "4", "--batches=2",
                           "--other_rate=24"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    assert lines[0] == {"ready": True} and len(lines) == 3
    assert set(fake_gpu.options) == {":fancy_upsampling=1"}  # the trainer's decoder
    for line in lines[1:]:  # the first batch at once, then one each 4/24 s: 4 in 0.5 s at most
        assert 4 <= line["images"] <= 16 and line["images"] % 4 == 0, line


def test_decode_process_runs_decode_loop_in_a_child(tmp_path, monkeypatch):
    """The child `_DecodeProcess` starts (`_decode_loop_argv`'s command, run with the fake GPU
    decoder installed) decodes whole batches of the parent's dataset for each call's seconds."""
    from scripts.bench import input as bench_input

    bench_input.prepare(str(tmp_path), 16, "array_record")
    args = argparse.Namespace(data_dir=str(tmp_path), num_images=16, image_size=32, canvas=128,
                              batches=2, repeats=1, other_rate=0.0)
    command = bench_gpu_decode._decode_loop_argv(args, 4)
    assert command[:4] == [sys.executable, "-m", "scripts.bench.gpu_decode", "decode_loop"]
    fake = ("from tests import gpu_fakes\n"
            "from jia_jax import gpu_decode\n"
            "from scripts.bench import gpu_decode as bench\n"
            "library = gpu_fakes.FakeNvImageCodec()\n"
            "gpu_decode.new_decoder = lambda device, options='', fancy_upsampling=True: ("
            "gpu_decode.NvImageCodecDecoder(device, library, gpu_fakes.FakeStream(), options, "
            "fancy_upsampling))\n"
            f"bench.main({command[3:]!r})\n")
    monkeypatch.setattr(bench_gpu_decode, "_decode_loop_argv",
                        lambda args, per_gpu: [sys.executable, "-c", fake])
    with bench_gpu_decode._DecodeProcess(args, 4) as other:
        images = [other(0.3), other(0.3)]
    assert other._child.returncode == 0
    assert all(n >= 4 and n % 4 == 0 for n in images), images


def test_decode_process_speaks_to_its_child_and_names_an_early_exit(monkeypatch):
    """`_DecodeProcess` waits for the child's ready line (other output skipped), sends each
    call's seconds and returns its images; a child that ends first is named with its exit."""
    child = ("import sys, json\nprint('noise'); print(json.dumps({'ready': True}), flush=True)\n"
             "for line in sys.stdin:\n"
             "    print(json.dumps({'images': int(float(line) * 10)}), flush=True)\n")
    args = argparse.Namespace()
    monkeypatch.setattr(bench_gpu_decode, "_decode_loop_argv",
                        lambda args, per_gpu: [sys.executable, "-c", child])
    with bench_gpu_decode._DecodeProcess(args, 4) as other:
        assert (other(0.5), other(2.0)) == (5, 20)
    assert other._child.returncode == 0
    monkeypatch.setattr(bench_gpu_decode, "_decode_loop_argv",
                        lambda args, per_gpu: [sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="ended \\(exit 3\\) before its 'ready' line"):
        bench_gpu_decode._DecodeProcess(args, 4)


def test_bench_gpu_decode_records_counts_the_second_half_per_batch_size(tmp_path):
    """`records` reads the host half alone (no decoder): per --per_gpu, whole batches across
    the epochs of a small dataset, timed over the second half of --record_seconds."""
    doc = bench_gpu_decode.main(
        ["records", f"--data_dir={tmp_path}", "--num_images=16", "--per_gpu", "4", "6",
         "--record_seconds=0.5", f"--out={tmp_path / 'records.json'}"]
    )
    rows = doc["results"]
    assert [(r["per_gpu"], r["num_workers"], r["seconds"]) for r in rows] == [
        (4, 0, 0.5), (6, 0, 0.5)
    ]
    for r in rows:
        assert r["images"] > 0 and r["images"] % r["per_gpu"] == 0, r
        assert 0 < r["records_images_per_s"] < float("inf"), r
        assert 0 < r["host_cpu_ms_per_batch"] < 1e3 * r["seconds"], r


def test_steady_cpu_ms_is_over_the_second_half_per_batch():
    # The same stamps as below; 2 ms of CPU a batch while the clock ran, 50 ms before it.
    stamps = [(0.001 * i, 10) for i in range(1, 6)] + [(0.1 * i, 10) for i in range(1, 11)]
    cpu_s = [0.05 * i for i in range(1, 6)] + [0.25 + 0.002 * i for i in range(1, 11)]
    assert bench_gpu_decode.steady_cpu_ms(stamps, cpu_s) == pytest.approx(2.0)


def test_steady_rate_leaves_out_the_first_half():
    # Batches of 10 images: 5 handed over at once (read while the clock was not running), then
    # one every 0.1 s. Over all the time the rate would be 1.5x the steady 100 images/s.
    stamps = [(0.001 * i, 10) for i in range(1, 6)] + [(0.1 * i, 10) for i in range(1, 11)]
    assert bench_gpu_decode.steady_rate(stamps) == pytest.approx((50, 100.0))
    with pytest.raises(ValueError, match="read for longer"):
        bench_gpu_decode.steady_rate([(0.1, 10), (1.0, 10)])


def test_flag_variants_rerun_the_one_device_row_of_a_one_gpu_run():
    # A one-GPU run (meshes 1x1 only) used to skip every --xla_flags_variant without a word.
    one = {"model": "resnet50", "devices": 1, "step_time_s": 0.045, "images_per_s": 5700.0}
    two = {"model": "resnet50", "devices": 2, "step_time_s": 0.046, "images_per_s": 11100.0}
    slower_two = {**two, "images_per_s": 10000.0}
    failed = {"model": "resnet50", "devices": 2, "error": "boom"}
    assert bench_step.variant_row([one], "resnet50") is one
    assert bench_step.variant_row([one, failed], "resnet50") is one
    assert bench_step.variant_row([one, slower_two, two], "resnet50") is two
    assert bench_step.variant_row([one], "alexnet_bn") is None


def test_a_timed_out_command_is_asked_to_stop_before_it_is_killed(monkeypatch):
    """A launcher must get SIGTERM (it forwards it to its trainers) and time to pass it on; one
    that ignores it is killed after the grace period; either way a 124 row, not an exception."""
    # The deaf command waits the whole grace period: 2 s is still ample for the polite one's trap.
    monkeypatch.setattr(harness, "_GRACE_S", 2.0)
    polite = "sleep 30 & trap 'echo forwarded; kill $!; exit 0' TERM; echo started; wait"
    status, log = harness.run_logged(["bash", "-c", polite], timeout=1)
    assert status == 124 and log.splitlines()[:2] == ["started", "forwarded"]
    assert log.endswith("timed out after 1 s: stopped\n")
    deaf = "trap '' TERM; echo started; exec sleep 30"  # no child left holding the pipes
    status, log = harness.run_logged(["bash", "-c", deaf], timeout=1)
    assert status == 124 and "forwarded" not in log and log.startswith("started")


def test_harness_times_every_step_and_queues_one_more():
    step = jax.jit(lambda state, batch: (state + batch, {"loss": state}))
    state, synced = harness.time_steps(step, jax.numpy.zeros(()), 1.0, 3, queued=False)
    assert float(state) == 3 and len(synced) == 3
    # Queued: a sample is the time between two completions, and one step is always in flight
    # ahead: 3 samples take 5 steps (it ran 4 and gave 2 samples before the fix).
    state, queued = harness.time_steps(step, state, 1.0, 3, queued=True)
    assert float(state) == 8 and len(queued) == 3
    rates = harness.step_rates(8, synced, queued)
    assert rates["step_time_s"] == statistics.median(queued)
    assert rates["images_per_s"] == pytest.approx(8 / statistics.median(queued), rel=1e-12)
    assert rates["synced_images_per_s"] == pytest.approx(8 / statistics.median(synced), rel=1e-12)
    # A stall: the median ignores it, the mean (what a run's logged interval sees) does not.
    stalled = harness.step_rates(8, [0.1] * 3, [0.1, 0.1, 0.4])
    assert stalled["images_per_s"] == pytest.approx(80.0, rel=1e-12)
    assert stalled["mean_images_per_s"] == pytest.approx(8 / 0.2, rel=1e-12)


def _cpu_processes(monkeypatch, devices: int) -> None:
    """Child processes of the multi-process benchmarks simulate `devices` CPU devices, over gloo."""
    # This process's backend starts first, with the suite's 8 devices: a benchmark that reads
    # the environment in-process (e.g. its record's device kind) would otherwise start it with
    # the children's flags, leaving every later test of this worker with their device count.
    jax.devices()
    monkeypatch.setenv("JIA_JAX_PLATFORM", "cpu")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
    # After conftest.py's fast-compile flags, which the children keep (the last count wins).
    count = f"--xla_force_host_platform_device_count={devices}"
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ['XLA_FLAGS']} {count}")
    # scripts/launch_local.sh starts `python3`: this interpreter.
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}")


def test_bench_hosts_rates_emulated_hosts_against_one_device(tmp_path, monkeypatch):
    # One device a process: the rows' runs are what is tested, not the mesh inside a host.
    _cpu_processes(monkeypatch, 1)
    # The other checkout's process 0 reads the flat row's init, data and checkpoint programs (its
    # step is the default strategy's; the seeded row's XLA flags differ: it compiles everything).
    _compile_cache(monkeypatch, tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a GPU per process, for what XLA is told
    # Another checkout whose digits config seeds differently: its row must run its own files.
    before = tmp_path / "before"
    for name in ("jia_jax", "configs", "scripts"):
        shutil.copytree(os.path.join(harness.REPO, name), before / name)
    digits = before / "configs" / "digits.py"
    text = digits.read_text().replace("    return config", "    config.seed = 5\n    return config")
    digits.write_text(text)
    out = tmp_path / "hosts.json"
    doc = bench_hosts.main(
        [
            "--hosts=2",
            "--gpus_per_host=1",
            "--batches=2",
            "--strategies=flat",
            "--row_variant=--config.seed=5 --config.comm.tell_xla_network=False",
            f"--row_variant=source={before}",
            "--steps=6",
            "--log_every=2",
            "--tiny",
            *SMALL_MODEL_OVERRIDES,
            f"--out={out}",
        ]
    )
    assert json.loads(out.read_text()) == doc
    one, flat, seeded, other_source = doc["results"]
    for row in (flat, seeded, other_source):
        assert "error" not in row, row["error"]
    assert (one["hosts"], flat["hosts"], flat["strategy"]) == (1, 2, "flat")
    # Each row keeps its logged intervals after the first (6 steps, one line every 2).
    for row in (one, flat, seeded, other_source):
        assert len(row["logged_images_per_s"]) == 2
        assert statistics.median(row["logged_images_per_s"]) == row["images_per_s"]
    # Efficiency against 2 x the one-device rate of the same run.
    assert flat["efficiency"] == pytest.approx(flat["images_per_s"] / (2 * one["images_per_s"]))
    assert "--hosts 2 1" in flat["command"] and doc["environment"]["backend"] == "cpu"
    # The override reached the trainer, and the other checkout's config was the one that ran.
    assert seeded["overrides"] == ["--config.seed=5", "--config.comm.tell_xla_network=False"]
    assert other_source["source"] == str(before)
    # Several processes tell XLA by default, one GPU per host here; the trainer's log says so.
    assert flat["told"] == other_source["told"] and seeded["told"] == ""
    assert flat["told"].startswith("gpus_per_node=1,partition_size=1,nic_speed_gbps="), flat
    assert seeded["loss"] == pytest.approx(other_source["loss"], rel=1e-3)
    # Another seed, another initialisation: 6.458 against 6.417 after 6 steps when written.
    assert abs(seeded["loss"] - flat["loss"]) > 1e-2, (seeded["loss"], flat["loss"])
    table = render_benchmarks.hosts_table(doc)
    assert "| 2x1 | default seed=5 comm.tell_xla_network=False, XLA untold | - | 2 |" in table
    assert "| 2x1 | default (trainer of before), XLA told | - | 2 |" in table


def test_bench_hosts_rounds_repeat_every_row_against_its_own_one_gpu_row(monkeypatch, tmp_path):
    # Round by round, in the same order; each round's efficiency against its own one-GPU rate.
    calls = []
    rates = iter([100.0, 150.0, 160.0, 50.0, 90.0, 80.0])

    def one_gpu_row(args, batch, env):
        calls.append(("one", batch))
        return {"images_per_s": next(rates)}

    def host_row(args, batch, strategy, env, variant):
        calls.append((strategy, batch, tuple((variant or {}).get("overrides", []))))
        return {"images_per_s": next(rates)}

    monkeypatch.setattr(bench_hosts, "one_gpu_row", one_gpu_row)
    monkeypatch.setattr(bench_hosts, "host_row", host_row)
    doc = bench_hosts.main(["--hosts=2", "--gpus_per_host=1", "--batches=64", "--rounds=2",
                            "--row_variant=--config.seed=5", f"--out={tmp_path / 'h.json'}"])
    seeded = ("--config.seed=5",)
    assert calls == [("one", 64), ("default", 64, ()), ("default", 64, seeded)] * 2
    rows = doc["results"]
    assert [r["run"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert [r["efficiency"] for r in rows] == [1.0, 0.75, 0.8, 1.0, 0.9, 0.8]
    table = render_benchmarks.hosts_table(doc)
    assert "| 2x1 | default seed=5 (run 2) | - | 64 | 80 | 0.800 |" in table


def test_bench_hosts_row_variant_sets_environment_variables_for_its_row(monkeypatch, tmp_path):
    # NAME=VALUE items reach the row's processes (launch_local.sh keeps a caller's NCCL_*);
    # the other rows and the one-GPU row run in the environment as it was.
    monkeypatch.delenv("NCCL_MAX_NCHANNELS", raising=False)
    envs = []

    def one_gpu_row(args, batch, env):
        envs.append(("one", env.get("NCCL_MAX_NCHANNELS"), env.get("NCCL_PROTO")))
        return {"images_per_s": 100.0}

    def host_row(args, batch, strategy, env, variant):
        envs.append((strategy, env.get("NCCL_MAX_NCHANNELS"), env.get("NCCL_PROTO")))
        return {"images_per_s": 150.0}

    monkeypatch.setattr(bench_hosts, "one_gpu_row", one_gpu_row)
    monkeypatch.setattr(bench_hosts, "host_row", host_row)
    doc = bench_hosts.main(["--hosts=2", "--gpus_per_host=1", "--batches=64",
                            "--row_variant=NCCL_MAX_NCHANNELS=1 NCCL_PROTO=Simple "
                            "--config.seed=5", f"--out={tmp_path / 'h.json'}"])
    assert envs == [("one", None, None), ("default", None, None), ("default", "1", "Simple")]
    assert doc["results"][2]["env"] == {"NCCL_MAX_NCHANNELS": "1", "NCCL_PROTO": "Simple"}
    table = render_benchmarks.hosts_table(doc)
    assert "| 2x1 | default seed=5 NCCL_MAX_NCHANNELS=1 NCCL_PROTO=Simple | - | 64 |" in table


def test_bench_hosts_row_variant_says_what_is_wrong():
    with pytest.raises(SystemExit):
        bench_hosts.main(["--row_variant=watch_peers=false"])
    with pytest.raises(ValueError, match="no jia_jax/main.py under source=/nonexistent"):
        bench_hosts.parse_row_variant("source=/nonexistent")


def test_bench_hosts_peer_rows_come_from_an_overlap_run_of_the_same_layout():
    args = argparse.Namespace(hosts=2, gpus_per_host=1, batches=[256, 64], tiny=False, peer=True,
                              in_process=[], in_process_network="")
    command = bench_hosts.in_process_command(args, "/tmp/p.json")
    assert command[1:] == ["-m", "scripts.bench.overlap", "--layouts=1x1,2x1",
                           "--batches=256,64", "--variants=peer", "--out=/tmp/p.json"]
    overlap_doc = {"results": [
        {"layout": "1x1", "variant": "overlap", "per_device_batch": 256, "images_per_s": 100.0,
         "hosts": 1, "gpus_per_host": 1, "efficiency": 1.0},
        {"layout": "2x1", "variant": "peer", "per_device_batch": 256, "images_per_s": 170.0,
         "hosts": 2, "gpus_per_host": 1, "efficiency": 0.85, "exposed_comm_ms": 7.5,
         "idle_ms": 0.8, "schedule": [], "timeline": {}},
    ]}
    [peer] = bench_hosts.in_process_rows(overlap_doc)
    assert peer == {"hosts": 2, "gpus_per_host": 1, "strategy": "peer", "timing": "in-process",
                    "per_device_batch": 256, "images_per_s": 170.0, "efficiency": 0.85,
                    "exposed_comm_ms": 7.5, "idle_ms": 0.8}
    doc = {"results": [peer], "environment": {"device_kind": "cpu", "device_count": 2,
                                              "jax_version": "0", "xla_flags": ""}}
    assert ("| 2x1 | peer (timed in-process, against its own one-GPU step) | - | 256 | 170 | "
            "0.850 | 7.5 | 0.8 |") in render_benchmarks.hosts_table(doc)


def test_hosts_table_names_the_run_of_a_file_merged_from_several_calls():
    row = {"hosts": 2, "gpus_per_host": 1, "strategy": "default", "per_device_batch": 64,
           "images_per_s": 160.0, "efficiency": 0.8, "told": "emulated",
           "overrides": ["--config.comm.dtype=float8_e4m3fn"]}
    doc = {"results": [row, {**row, "run": 2}],
           "environment": {"device_kind": "cpu", "device_count": 2, "jax_version": "0",
                           "xla_flags": ""}}
    table = render_benchmarks.hosts_table(doc)
    assert "| 2x1 | default comm.dtype=float8_e4m3fn, XLA told | - | 64 |" in table
    assert "| 2x1 | default comm.dtype=float8_e4m3fn, XLA told (run 2) | - | 64 |" in table


def test_bench_hosts_times_more_variants_in_process_told_as_the_trainer():
    # The trainer's own step beside its loop: --in_process adds variants to the peer (once
    # each, the peer first), told the network where asked, and each row says it was told.
    args = argparse.Namespace(hosts=2, gpus_per_host=1, batches=[64], tiny=False, peer=True,
                              in_process=["overlap_cap", "peer"], in_process_network="emulated")
    command = bench_hosts.in_process_command(args, "/tmp/p.json")
    assert "--variants=peer,overlap_cap" in command
    assert "--tell_xla_network=emulated" in command
    overlap_doc = {"results": [
        {"layout": "1x1", "variant": "overlap", "per_device_batch": 64, "images_per_s": 100.0,
         "hosts": 1, "gpus_per_host": 1},
        {"layout": "2x1", "variant": "overlap_cap", "per_device_batch": 64, "images_per_s": 160.0,
         "hosts": 2, "gpus_per_host": 1, "efficiency": 0.8, "told": "emulated",
         "mean_images_per_s": 150.0, "loop_images_per_s": 145.0, "samples_s": [0.4]},
        {"layout": "2x1", "variant": "peer", "per_device_batch": 64, "images_per_s": 140.0,
         "hosts": 2, "gpus_per_host": 1, "efficiency": 0.7, "told": "emulated"},
    ]}
    rows = bench_hosts.in_process_rows(overlap_doc)
    # The mean and loop rates travel where the run has them; the samples do not.
    assert (rows[0]["mean_images_per_s"], rows[0]["loop_images_per_s"]) == (150.0, 145.0)
    assert "samples_s" not in rows[0] and "loop_images_per_s" not in rows[1]
    assert [(r["strategy"], r["told"], r["efficiency"]) for r in rows] == [
        ("overlap_cap", "emulated", 0.8), ("peer", "emulated", 0.7)]
    doc = {"results": rows, "environment": {"device_kind": "cpu", "device_count": 2,
                                            "jax_version": "0", "xla_flags": ""}}
    assert ("| 2x1 | overlap_cap (timed in-process, against its own one-GPU step), XLA told | - "
            "| 64 | 160 | 0.800 | - | - |") in render_benchmarks.hosts_table(doc)


def test_bench_overlap_times_the_variants_of_a_batch_in_turn_each_round(monkeypatch, capsys):
    # Every variant is compiled first, then each round times every variant once (the link's
    # drift within a call reaches all rows alike); rows are printed after the last round; a
    # variant that fails to compile or to run loses only its row.
    from scripts.bench import overlap as bench_overlap

    calls = []

    def prepare(args, variant, batch, processes, gpus):
        calls.append(("compile", variant))
        if variant == "no_overlap":
            raise RuntimeError("rejected")
        return {"variant": variant, "rounds_timed": 0}

    def time_round(p, steps):
        calls.append(("time", p["variant"]))
        if p["variant"] == "peer" and p["rounds_timed"] == 1:
            raise RuntimeError("out of memory")
        p["rounds_timed"] += 1

    monkeypatch.setattr(bench_overlap, "_prepare", prepare)
    monkeypatch.setattr(bench_overlap, "_time_round", time_round)
    monkeypatch.setattr(bench_overlap, "_row", lambda p: {"timed": p["rounds_timed"]})
    args = argparse.Namespace(layout="1x2", batches=[8], steps=2, rounds=3, hlo_dir="",
                              variants=["overlap", "no_overlap", "peer", "overlap_4mib"])
    bench_overlap.worker(args)
    assert calls == [("compile", v) for v in args.variants] + [
        ("time", "overlap"), ("time", "peer"), ("time", "overlap_4mib"),
        ("time", "overlap"), ("time", "peer"), ("time", "overlap_4mib"),
        ("time", "overlap"), ("time", "overlap_4mib"),
    ]
    rows = [json.loads(line.removeprefix("OVERLAP_ROW ")) for line in
            capsys.readouterr().out.splitlines() if line.startswith("OVERLAP_ROW ")]
    got = {r["variant"]: r.get("timed", r.get("error", "").strip().splitlines()[-1:])
           for r in rows}
    assert got == {"no_overlap": ["RuntimeError: rejected"],
                   "peer": ["RuntimeError: out of memory"], "overlap": 3, "overlap_4mib": 3}
    assert all(r["rounds"] == 3 and r["per_device_batch"] == 8 for r in rows)


def test_bench_overlap_rates_each_timed_row_against_one_device_of_its_batch():
    from scripts.bench import overlap as bench_overlap

    def row(layout, hosts, batch, queued, synced, mean):
        return {"layout": layout, "hosts": hosts, "gpus_per_host": 1, "per_device_batch": batch,
                "images_per_s": queued, "synced_images_per_s": synced, "mean_images_per_s": mean}

    rows = [row("1x1", 1, 256, 100.0, 90.0, 80.0), row("2x1", 2, 256, 190.0, 171.0, 120.0),
            row("2x1", 2, 64, 150.0, 140.0, 130.0),  # no 1x1 row of its batch
            {"layout": "2x1", "per_device_batch": 256, "error": "RuntimeError: out of memory"}]
    bench_overlap._add_efficiencies(rows)
    assert [rows[1][k] for k in ("efficiency", "synced_efficiency", "mean_efficiency")] == [
        0.95, 0.95, 0.75]
    assert rows[0]["efficiency"] == 1.0
    assert "efficiency" not in rows[2] and "efficiency" not in rows[3]


def test_bench_overlap_writes_each_compiled_step_hlo_where_asked(monkeypatch, tmp_path):
    # `--hlo_dir`: the optimized HLO of each variant that compiled, named by layout, variant and
    # batch (what a schedule row is read from, kept to trace an operand's producers).
    from scripts.bench import overlap as bench_overlap

    class Compiled:
        def __init__(self, variant):
            self.variant = variant

        def as_text(self):
            return f"HloModule {self.variant}"

    def prepare(args, variant, batch, processes, gpus):
        if variant == "no_overlap":
            raise RuntimeError("rejected")
        return {"variant": variant, "compiled": Compiled(variant)}

    monkeypatch.setattr(bench_overlap, "_prepare", prepare)
    monkeypatch.setattr(bench_overlap, "_time_round", lambda p, steps: None)
    monkeypatch.setattr(bench_overlap, "_row", lambda p: {})
    args = argparse.Namespace(layout="1x2", batches=[8, 4], steps=1, rounds=1,
                              hlo_dir=str(tmp_path / "hlo"), variants=["overlap", "no_overlap"])
    bench_overlap.worker(args)
    written = {p.name: p.read_text() for p in (tmp_path / "hlo").iterdir()}
    assert written == {"1x2_overlap_8.hlo": "HloModule overlap",
                       "1x2_overlap_4.hlo": "HloModule overlap"}


def test_bench_overlap_tells_the_hosts_xla_the_network_and_marks_their_rows(monkeypatch):
    # Hosts of one GPU told the emulated network start with the estimator option (partition_size
    # too: without it XLA's schedule stayed the same) and their rows say so; one process is not
    # told (no network), and the caller's XLA_FLAGS come back as they were.
    from scripts.bench import emulated_hosts
    from scripts.bench import overlap as bench_overlap

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/d")
    seen = []

    workers = []

    def run(module_args, processes, gpus, nccl, timeout):
        seen.append(os.environ["XLA_FLAGS"])
        workers.append(module_args(0, 1234))
        row = {"variant": "overlap", "per_device_batch": 8, "images_per_s": 1.0}
        return [0] * processes, [bench_overlap._ROW + json.dumps(row)] * processes

    monkeypatch.setattr(emulated_hosts, "run", run)
    args = argparse.Namespace(
        tell_xla_network="emulated", steps=1, warmup_steps=0, rounds=1, batches=[8],
        variants=["overlap"], layout_variants={}, tiny=False, hlo_dir="", nccl={}, timeout_s=9,
        told_bandwidth=1.0, loop_timing=False, convolution_graphs="never",
    )
    two = bench_overlap._layout_rows(args, "2x1", math.inf)
    one = bench_overlap._layout_rows(args, "1x1", math.inf)
    assert [r.get("told") for r in two + one] == ["emulated", None]
    assert seen[0].startswith("--xla_dump_to=/d --xla_gpu_analytical_latency_estimator_options=")
    assert "gpus_per_node=1,partition_size=1," in seen[0] and seen[1] == "--xla_dump_to=/d"
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/d"
    # Told half the network's bandwidth: the option says so, and so do the rows.
    full = comm_model.network_model("emulated").inter.beta_bytes_per_s
    halved = argparse.Namespace(**{**vars(args), "told_bandwidth": 0.5})
    [half] = bench_overlap._layout_rows(halved, "2x1", math.inf)
    assert f"nic_speed_gbps={full / 2e9:.3f}," in seen[-1]
    assert half["told"] == "emulated x0.5 bandwidth"
    # The workers time the step as the loop runs it only where asked, compiled as asked.
    assert not any("--loop_timing" in w for w in workers)
    assert all("--convolution_graphs=never" in w for w in workers)
    looped = argparse.Namespace(**{**vars(args), "loop_timing": True})
    bench_overlap._layout_rows(looped, "2x1", math.inf)
    assert "--loop_timing" in workers[-1]


def test_bench_overlap_keeps_each_process_collective_spans(monkeypatch):
    # The trace figures are averaged over the processes, but each process's collective kernels
    # are kept as its own: one process reaching a collective first waits in it for the other.
    from scripts.bench import emulated_hosts
    from scripts.bench import overlap as bench_overlap
    from scripts.bench.profile_trace import Kernel

    kernels = [Kernel("fusion", 1000.0, 3000.0, "s0", "fusion"),
               Kernel("ncclDevKernel_AllReduce", 4500.0, 5250.0, "s1", "collective"),
               Kernel("ncclDevKernel_AllGather", 2000.0, 2500.0, "s1", "collective")]
    assert bench_overlap.collective_spans(kernels) == [[1.0, 1.5], [3.5, 4.25]]
    rows = [{"variant": "overlap", "per_device_batch": 8, "images_per_s": 1.0,
             "exposed_comm_ms": exposed, "idle_ms": 0.0, "queued_collectives_ms": [spans]}
            for exposed, spans in ((1.0, [[0.0, 5.0]]), (3.0, [[0.0, 1.0]]))]

    def run(module_args, processes, gpus, nccl, timeout):
        return [0, 0], [bench_overlap._ROW + json.dumps(r) for r in rows]

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(emulated_hosts, "run", run)
    args = argparse.Namespace(
        tell_xla_network="", steps=1, warmup_steps=0, rounds=1, batches=[8],
        variants=["overlap"], layout_variants={}, tiny=False, hlo_dir="", nccl={}, timeout_s=9,
        told_bandwidth=1.0, loop_timing=False, convolution_graphs="auto",
    )
    [row] = bench_overlap._layout_rows(args, "2x1", math.inf)
    assert row["exposed_comm_ms"] == 2.0
    assert row["queued_collectives_ms"] == [[[[0.0, 5.0]]], [[[0.0, 1.0]]]]


def test_collectives_table_shows_each_process_time_per_traced_step():
    schedule = [{"op": "all-reduce", "shape": "((bf16[8]{0}), bf16[8]{0})"},
                {"op": "all-reduce", "shape": "((f32[2]{0}), f32[2]{0})"}]
    row = {"layout": "2x1", "variant": "told", "per_device_batch": 64, "schedule": schedule,
           "queued_collectives_ms": [[[[0.0, 5.0], [6.0, 6.5], [10.0, 11.0], [12.0, 12.25]]],
                                     [[[1.0, 2.0], [3.0, 3.5], [9.0, 10.0], [11.0, 11.25]]]]}
    one = {"layout": "1x1", "variant": "overlap", "per_device_batch": 64,
           "queued_collectives_ms": [[[]]]}
    table = render_benchmarks.overlap_collectives_table({"results": [one, row]})
    lines = [line for line in table.splitlines() if line.startswith("| told")]
    assert lines == ["| told | 64 | 1 | all-reduce bf16[8] | 5.00 | 1.00 |",
                     "| told | 64 | 1 | all-reduce f32[2] | 0.50 | 0.50 |",
                     "| told | 64 | 2 | all-reduce bf16[8] | 1.00 | 1.00 |",
                     "| told | 64 | 2 | all-reduce f32[2] | 0.25 | 0.25 |"]


@pytest.mark.parametrize("profile_steps", [0, 2])
def test_bench_hosts_traces_the_one_gpu_row_after_its_timed_steps(monkeypatch, profile_steps):
    """With --profile_steps the one-GPU row is traced as the default strategy's rows are, after
    its timed steps: its rate comes from the lines before the trace starts and its figures
    (exposed communication, boundaries) from the trace; without, neither is traced."""
    from jia_jax import loop

    def line(step, rate):
        return (f"I0 loop.py] step {step:3d}/9 | learning_rate 0.1 | loss 3.0 | top1 0 | "
                f"{rate} img/s | ETA 0:00:01")

    commands = []

    def run(command, env, cwd=None):
        commands.append(command)
        workdir = next(c.split("=", 1)[1] for c in command if c.startswith("--workdir="))
        tail = line(9, 1.0)
        if any(c.startswith("--config.profile.steps=") for c in command):
            # Kernels at [0, 10], [12, 20], [20.5, 30]: boundaries of 2 and 0.5 µs in 2 steps.
            _write_process_trace(workdir, 0, [_trace_event(7, 3, "fusion", t, d)
                                              for t, d in ((0, 10), (12, 8), (20.5, 9.5))])
            tail = f"{loop.TRACE_STARTS}\n{tail}"
        return "\n".join([line(2, 10.0), line(4, 300.0), line(6, 100.0), tail])

    monkeypatch.setattr(bench_hosts, "run", run)
    args = bench_hosts._parser().parse_args(
        ["--tiny", "--steps=6", "--log_every=2", f"--profile_steps={profile_steps}"])
    row = bench_hosts.one_gpu_row(args, 2, {"JIA_JAX_PLATFORM": "gpu"})
    traced = any(c.startswith("--config.profile.steps=") for c in commands[0])
    assert traced == bool(profile_steps)
    # The slow line (1 img/s) after the trace's start is not timed; untraced, it is.
    assert (row["images_per_s"], row["logged_images_per_s"]) == (
        (200.0, [300.0, 100.0]) if profile_steps else (100.0, [300.0, 100.0, 1.0]))
    if profile_steps:
        (boundaries,) = row["boundaries"]
        assert boundaries["sum_us_per_step"] == pytest.approx(2.5 / 2)
        assert row["exposed_comm_ms"] == 0.0
    else:
        assert "boundaries" not in row


def test_bench_hosts_boundaries_render_a_row_per_traced_gpu():
    b = {"count_per_step": 1244.5, "negative_per_step": 879.0, "p50_us": -0.128,
         "sum_us_per_step": 47.4}
    doc = {"environment": {"device_count": 2, "device_kind": "GPU", "jax_version": "0",
                           "xla_flags": ""},
           "results": [
               {"hosts": 1, "gpus_per_host": 1, "strategy": "default", "per_device_batch": 64,
                "boundaries": [b]},
               {"hosts": 2, "gpus_per_host": 1, "strategy": "default", "per_device_batch": 64,
                "told": "x", "boundaries": [b, {**b, "p50_us": None}]},
               {"hosts": 2, "gpus_per_host": 1, "strategy": "peer", "per_device_batch": 64}]}
    table = render_benchmarks.hosts_boundaries_table(doc)
    rows = [line.split(" | ")[2:] for line in table.splitlines() if line.startswith("| 1x1")
            or line.startswith("| 2x1")]
    assert rows == [["64", "0", "1,244", "879", "-0.13", "47 |"],
                    ["64", "0", "1,244", "879", "-0.13", "47 |"],
                    ["64", "1", "1,244", "879", "-", "47 |"]]


def test_bench_hosts_accounting_adds_the_steady_columns_only_where_the_file_has_them():
    env = {"device_count": 2, "device_kind": "GPU", "jax_version": "0", "xla_flags": ""}
    row = {"hosts": 2, "gpus_per_host": 1, "strategy": "default", "per_device_batch": 64,
           "images_per_s": 8000.0, "span_ms": 15.7, "compute_ms": 12.0, "exposed_comm_ms": 3.42,
           "idle_ms": 0.28}
    one = {**row, "hosts": 1, "images_per_s": 5000.0, "exposed_comm_ms": 0.0}
    before = render_benchmarks.hosts_accounting_table({"environment": env, "results": [one, row]})
    assert "steps after the first" not in before
    assert before.splitlines()[-1] == (
        "| 2x1 | default | 64 | 16.00 | 15.70 | 12.00 | 3.42 | 0.28 |")  # 64 / (8000 / 2) s
    steady = {"steps": 2, "span_ms": 14.81, "exposed_comm_ms": 1.5, "compute_ms": 12.0,
              "idle_ms": 0.2}
    table = render_benchmarks.hosts_accounting_table(
        {"environment": env, "results": [{**one, "steady": None}, {**row, "steady": steady}]})
    lines = table.splitlines()
    assert lines[2].endswith("| idle ms | steps after the first: step ms | exposed comm ms |")
    assert lines[3].count("---:") == 8
    assert lines[-2].endswith("| 0.00 | 0.28 | - | - |")
    assert lines[-1] == "| 2x1 | default | 64 | 16.00 | 15.70 | 12.00 | 3.42 | 0.28 | 14.81 | 1.50 |"


def test_bench_hosts_takes_the_median_after_the_compile_interval():
    log = "\n".join(
        f"I0 loop.py] step {s:3d}/90 | learning_rate 0.1 | loss {l} | top1 0 | {r} img/s | ETA 0:00:01"
        for s, l, r in ((30, 5.0, 10.0), (60, 4.0, 300.0), (90, 3.0, 100.0))
    )
    # The first interval holds the compile; the median of the other two, which are kept.
    assert bench_hosts.steady_rate(log) == (200.0, 3.0, [300.0, 100.0])
    with pytest.raises(ValueError, match="fewer than two progress lines"):
        bench_hosts.steady_rate(log.splitlines()[0])


def test_bench_hosts_keeps_the_launch_ms_after_the_compile_interval():
    log = "\n".join(
        f"I0 loop.py] step {s:3d}/90 | learning_rate 0.1 | loss 3.0 | top1 0 | 100.0 img/s"
        f" | input wait 1% | launch {ms} ms a step | ETA 0:00:01"
        for s, ms in ((30, 900.0), (60, 8.5), (90, 12.25))
    )
    # The first interval's launch holds the compile; lines without the field add nothing.
    assert bench_hosts.logged_launch_ms(log) == [8.5, 12.25]
    old = log.replace(" | launch 8.5 ms a step", "")
    assert bench_hosts.logged_launch_ms(old) == [12.25]


def test_bench_link_reports_each_axis_and_size_over_processes(tmp_path, monkeypatch):
    _cpu_processes(monkeypatch, 2)
    out = tmp_path / "link.json"
    doc = bench_link.main(
        [
            "--size_mib=0.01,0.02",
            "--repeats=1",
            "--calls=1",
            "--variants=one_host,hosts_sockets_4x4",
            f"--out={out}",
        ]
    )
    rows = doc["results"]
    assert [r["variant"] for r in rows] == ["one_host"] * 2 + ["hosts_sockets_4x4"] * 2, rows
    assert rows[-1]["settings"]["NCCL_NSOCKS_PERTHREAD"] == "4"
    for row, mib in zip(rows, (0.01, 0.02) * 2, strict=True):
        n = int(mib * (1 << 20)) // 4
        assert row["size_bytes"] == 4 * n
        for axis, ranks in (("gpu", 2), ("node", 2), ("both", 4)):
            r = row[axis]
            assert r["ranks"] == ranks
            assert r["bus_gb_s"] == pytest.approx(
                2 * (ranks - 1) / ranks * n * 4 / r["time_s"] / 1e9
            )
    assert "| hosts_sockets_4x4 | 0.02 | 2 |" in render(str(out))


def test_plot_profile_draws_a_recorded_profile(tmp_path):
    out = tmp_path / "timeline.png"
    bench_plot_profile.main(
        [
            os.path.join(harness.REPO, "docs/benchmarks/profile_2xH100.json.kernels.json.gz"),
            "resnet50:1x2:hierarchical:256:bfloat16",
            str(out),
            # A window a fifth of a step long (as if 25 steps were traced): both GPUs' lanes and
            # every kind of kernel, 529 bars instead of 3,053 (matplotlib draws them one by one).
            "--steps=25",
        ]
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_input_stage_costs_times_every_stage(capsys):
    bench_input_stage_costs.main()
    lines = capsys.readouterr().out.splitlines()
    # Stage lines end in "<ms> ms"; optional decoders that are not installed say so instead.
    times = {
        line[:40].strip(): float(line[40:].split()[0]) for line in lines if line.endswith(" ms")
    }
    assert {"pil decode", "pil resize box"} <= set(times), lines
    assert all(ms > 0 for ms in times.values()), times


def test_model_options_turn_model_fields_on_and_off_and_name_a_missing_one():
    # AlexNet-BN's config has both off, ResNet-50's both on: each turned the other way alone.
    config = trainer_step.make_config(
        "alexnet_bn", "flat", 1, 1, model_options=["sliced_max_pool", "no_space_to_depth_stem"]
    )
    assert config.model.sliced_max_pool and not config.model.space_to_depth_stem
    config = trainer_step.make_config(
        "resnet50", "flat", 1, 1, model_options=["no_sliced_max_pool"]
    )
    assert not config.model.sliced_max_pool and config.model.space_to_depth_stem
    # A retired option (scripts of its time passed no_fused_bn) is named, not ignored.
    with pytest.raises(ValueError, match="no model.fused_bn"):
        trainer_step.make_config("resnet50", "flat", 1, 1, model_options=["no_fused_bn"])


def test_overlap_schedule_reads_each_collective_of_the_entry_computation():
    # A scheduled entry computation as XLA prints it: a convolution, an asynchronous all-reduce
    # with a convolution between its start and done, a synchronous one, another convolution.
    # The second reads the first convolution through a fusion that XLA put after the second.
    from scripts.bench import overlap as bench_overlap

    conv = 'custom-call(%p), custom_call_target="__cudnn$convForward"'
    hlo = "\n".join(
        [
            "HloModule m, is_scheduled=true",
            "",
            "ENTRY %main (p: f32[4]) -> f32[4] {",
            "  %p = f32[4]{0} parameter(0)",
            f"  %c0 = f32[4]{{0}} {conv}",
            "  %s = ((bf16[8]{0}), bf16[8]{0}) all-reduce-start(%c0), to_apply=%add",
            f"  %c1 = f32[4]{{0}} {conv}",
            "  %d = bf16[8]{0} all-reduce-done(%s)",
            "  %f = f32[2]{0} fusion(f32[4]{0} %c0, %p), kind=kLoop, calls=%fused",
            '  %s2 = ((f32[2]{0}), f32[2]{0}) all-reduce-start(%f), backend_config={"is_sync":true}',
            "  %d2 = f32[2]{0} all-reduce-done(%s2)",
            f"  ROOT %c2 = f32[4]{{0}} {conv}",
            "}",
            "",
        ]
    )
    first, second = bench_overlap.schedule(hlo)
    # Positions count the lines of the entry computation, its header line being 0.
    assert (first["start_index"], first["done_index"]) == (3, 5)
    assert first["convolutions_before_start"] == 1 and first["convolutions_between"] == 1
    assert not first["sync"] and second["sync"]
    assert second["convolutions_before_start"] == 2 and second["convolutions_between"] == 0
    assert first["convolutions"] == 3 and first["shape"].startswith("((bf16[8]")
    # Both could have started after the first convolution: the second waited for the schedule.
    assert first["convolutions_until_ready"] == second["convolutions_until_ready"] == 1
    row = {"layout": "2x1", "variant": "v", "per_device_batch": 2, "schedule": [first]}
    doc = {"results": [row]}
    assert "| v | 2 | bf16[8] | 1 | 1 | 1 | 3 |" in render_benchmarks.overlap_schedule_table(doc)


def test_overlap_schedule_reads_the_fp8_wires_all_to_all():
    from scripts.bench import overlap as bench_overlap

    conv = 'custom-call(%p), custom_call_target="__cudnn$convForward"'
    hlo = "\n".join([
        "HloModule m, is_scheduled=true",
        "",
        "ENTRY %main (p: u8[2,6]) -> f32[4] {",
        "  %p = u8[2,6]{1,0} parameter(0)",
        "  %a = ((u8[2,6]{1,0}), u8[2,6]{1,0}) all-to-all-start(%p), replica_groups={{0,1}}",
        f"  %c0 = f32[4]{{0}} {conv}",
        "  %d = u8[2,6]{1,0} all-to-all-done(%a)",
        "  ROOT %r = f32[4]{0} copy(%c0)",
        "}",
        "",
    ])
    [a2a] = bench_overlap.schedule(hlo)
    assert a2a["op"] == "all-to-all" and a2a["convolutions_between"] == 1 and not a2a["sync"]
    # The schedule table names it by its operand; a combined all-gather by each bucket's, and the
    # statistics' fp32 all-reduce not at all.
    gather = {**a2a, "op": "all-gather", "shape": "((u8[1,6]{1,0}, u8[1,4]{1,0}), u8[2,6]{1,0})"}
    stats = {**a2a, "op": "all-reduce", "shape": "((f32[5]{0}), f32[5]{0})"}
    row = {"layout": "2x1", "variant": "v", "per_device_batch": 2, "hosts": 2, "gpus_per_host": 1,
           "schedule": [a2a, gather, stats]}
    table = render_benchmarks.overlap_schedule_table({"results": [row]})
    assert "| v | 2 | all-to-all u8[2,6] | 0 | 0 | 1 | 1 |" in table
    assert "| v | 2 | all-gather u8[1,6] + u8[1,4] |" in table and "f32" not in table


def test_weight_gradient_places_counts_among_the_entry_convolutions():
    # Forward, data-gradient and weight-gradient convolutions in one entry computation; a
    # backward-filter call in another computation (a fusion's) is not the entry's.
    from scripts.bench import overlap as bench_overlap

    def call(name, target):
        return f'  %{name} = f32[4]{{0}} custom-call(%p), custom_call_target="__cudnn${target}"'

    hlo = "\n".join(
        [
            "HloModule m, is_scheduled=true",
            "%fused {",
            call("x", "convBackwardFilter"),
            "}",
            "",
            "ENTRY %main (p: f32[4]) -> f32[4] {",
            call("f", "convForward"),
            call("d", "convBackwardInput"),
            call("w1", "convBackwardFilter"),
            "  %t = f32[4]{0} transpose(%w1), dimensions={0}",
            call("d2", "convForward"),
            call("w2", "convBackwardFilter"),
            "}",
            "",
        ]
    )
    assert bench_overlap.weight_gradient_places(hlo) == [2, 4]


def test_overlap_variants_xla_options_are_known_to_this_compiler():
    # An unknown or unsettable option fails a variant's compile on the GPU machine, in its row.
    from scripts.bench import overlap as bench_overlap

    lowered = jax.jit(lambda x: 2 * x).lower(jax.numpy.ones(3))
    for name, variant in bench_overlap.VARIANTS.items():
        if "xla" in variant:
            lowered.compile(variant["xla"])  # raises INVALID_ARGUMENT otherwise
    with pytest.raises(Exception, match="xla_gpu_no_such_option"):
        lowered.compile({"xla_gpu_no_such_option": True})


def test_emulated_hosts_timeout_counts_from_the_start_for_every_process():
    """A run's limit is one deadline: the second process is not given a fresh timeout after the
    first is killed (two 2 s waits made a layout overrun its benchmark's budget)."""
    import time

    from scripts.bench import emulated_hosts

    sleeper = ["timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)"]
    start = time.monotonic()
    codes, logs = emulated_hosts.run(lambda i, port: sleeper, 2, 0, {}, timeout=2.0)
    elapsed = time.monotonic() - start
    assert all(log.endswith("[killed: timeout]") for log in logs)
    assert all(code is not None and code < 0 for code in codes)  # killed, not exited
    assert elapsed < 3.5, elapsed  # one 2 s deadline, not 2 x 2 s


def test_overlap_rows_record_the_plan_auto_resolved_to():
    """An 'auto' row of `scripts/bench/overlap.py` names the plan its step ran (the calibration
    predicts it as that plan); an explicit row records nothing more than its config."""
    from jia_jax import comm_model
    from scripts.bench import overlap as bench_overlap
    from scripts.bench import trainer_step

    tiny = dict(image_size=32, model_width=8, small_inputs=True, per_device_batch_override=2)
    explicit = trainer_step.make_config("resnet50", "flat", 2, 2, **tiny)
    auto = trainer_step.make_config("resnet50", "auto", 2, 2, **tiny)
    setup = trainer_step.build_setup(auto, jax.devices())
    params = jax.eval_shape(setup["init"]).params
    assert bench_overlap.resolved_plan(explicit, setup, params) == {}
    plan = bench_overlap.resolved_plan(auto, setup, params)["resolved"]
    assert plan["strategy"] in comm_model.STRATEGIES
    assert plan["bucket_bytes"] in comm_model.BUCKET_GRID
    assert plan["hybrid_crossover_bytes"] in (0, *comm_model.BUCKET_GRID)


def test_error_text_names_repository_files_relative_to_the_checkout():
    from scripts.bench import harness

    where = os.path.join(harness.REPO, "jia_jax", "models", "layers.py")
    e = ValueError(f"rule attached to _plain at {where}:81 must produce " + "x" * 3000)
    head = harness.error_text(e)
    assert head.startswith("ValueError: rule attached to _plain at jia_jax/models/layers.py:81 ")
    assert len(head) == 2000 and harness.REPO not in head
    tail = harness.error_text(e, limit=10, tail=True)
    assert tail == "x" * 10


def test_bench_gpu_decode_crop_times_the_program_per_batch(tmp_path):
    """The `crop` mode times the crop-and-resize program alone for each batch size and kernel,
    one padded tile per example of the generated images' size; a kernel that cannot run here
    (Pallas' Triton kernels need a GPU) leaves an error in its rows, not a lost record."""
    doc = bench_gpu_decode.main(
        ["crop", f"--data_dir={tmp_path}", "--num_images=8", "--image_size=32", "--canvas=512",
         "--per_gpu", "4", "2", "--repeats=2", "--crop_kernels", "xla", "pallas",
         f"--out={tmp_path / 'crop.json'}"]
    )
    rows = [r for r in doc["results"] if r["kernel"] == "xla"]
    assert [(r["per_gpu"], r["tiles"]) for r in rows] == [(4, 4), (2, 2)], rows
    pallas = [r for r in doc["results"] if r["kernel"] == "pallas"]
    assert [r["per_gpu"] for r in pallas] == [4, 2] and all(r["error"] for r in pallas)
    for r in rows:
        assert r["ms_per_batch"] == pytest.approx(1e3 / r["batches_per_s"])
        assert r["ms_per_batch"] > 0


def test_harness_times_the_step_as_the_training_loop_runs_it():
    """`time_loop`: every call gets the stop flags; step t's metrics reach the host once step
    t + lag is dispatched, so `steps` samples take `steps + lag + 1` calls."""
    calls = []

    def step(state, batch, stop):
        calls.append(stop)
        return state + batch, {"loss": state}

    stop = jax.numpy.zeros((2,), jax.numpy.int32)
    state, samples = harness.time_loop(step, jax.numpy.zeros(()), 1.0, stop, steps=3, lag=2)
    assert len(calls) == 6 and all(s is stop for s in calls)
    assert float(state) == 6 and len(samples) == 3 and all(s >= 0 for s in samples)


def test_bench_overlap_loop_timing_runs_the_step_with_stop_flags(monkeypatch):
    """`--loop_timing`: the step compiled again with the stop flags (as `jia_jax.loop` calls
    it) and timed so, its rate over the mean of its samples; the peer's step takes no stop flags
    and is timed as before."""
    from configs import default
    from scripts.bench import overlap as bench_overlap

    mesh = jax.make_mesh((1, 1), ("node", "gpu"), devices=jax.devices()[:1])
    traced = []

    class State(typing.NamedTuple):
        params: jax.Array

    @jax.jit
    def step(state, batch, stop=None):
        traced.append(stop is not None)
        return State(state.params + batch), {"loss": state.params}

    setup = {"init": lambda: State(jax.numpy.zeros(())), "batch": jax.numpy.ones(()),
             "mesh": mesh}
    monkeypatch.setattr(bench_overlap, "_build", lambda *a: (step, setup, default.get_config()))
    monkeypatch.setattr(bench_overlap, "resolved_plan", lambda *a: {})
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    args = argparse.Namespace(warmup_steps=1, loop_timing=True, convolution_graphs="auto")
    prepared = bench_overlap._prepare(args, "overlap", 2, 1, 1)
    assert traced == [False, True] and prepared["fields"]["convolution_graphs"] is False
    bench_overlap._time_round(prepared, 2)
    samples = prepared["looped"]["samples"]
    assert len(samples) == 2 and len(prepared["queued"]) == 2
    # 1 warm-up, then 2 synced, 2 + 2 queued and 2 + METRICS_LAG + 1 looped steps of +1 each.
    assert float(prepared["state"].params) == 1 + 2 + 4 + 5
    row = bench_overlap._row(prepared)
    assert row["loop_images_per_s"] == pytest.approx(2 / statistics.mean(samples))
    peer = bench_overlap._prepare(args, "peer", 2, 1, 1)
    assert peer["looped"] is None and traced == [False, True]  # the cached step, no stop flags


def test_bench_overlap_compiles_each_step_as_the_trainer_does(monkeypatch):
    """Where the trainer would put the step's convolutions in command buffers, so does the
    benchmark: each compile (the step, and the loop's with stop flags) primed by one step
    compiled without them, with the variant's XLA options in both compiles; `never` compiles
    plainly. Fails if the benchmark times another executable than the trainer runs."""
    from configs import default
    from jia_jax import step_graphs
    from scripts.bench import overlap as bench_overlap

    mesh = jax.make_mesh((1, 1), ("node", "gpu"), devices=jax.devices()[:1])

    class State(typing.NamedTuple):
        params: jax.Array

    @jax.jit
    def step(state, batch, stop=None):
        return State(state.params + batch), {"loss": state.params}

    setup = {"init": lambda: State(jax.numpy.zeros(())), "batch": jax.numpy.ones(()),
             "mesh": mesh}
    compiles = []
    real = step_graphs.compile_like_training

    def recorded(lowered, mode, state, *rest, options=None):
        out = real(lowered, mode, state, *rest, options=options)
        compiles.append((len(rest), options, out[2]))
        return out

    monkeypatch.setattr(bench_overlap, "_build", lambda *a: (step, setup, default.get_config()))
    monkeypatch.setattr(bench_overlap, "resolved_plan", lambda *a: {})
    monkeypatch.setattr(step_graphs, "compile_like_training", recorded)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # where the trainer uses graphs
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    options = bench_overlap.VARIANTS["overlap_cap"]["xla"]
    assert options  # a variant with options of its own
    args = argparse.Namespace(warmup_steps=1, loop_timing=True, convolution_graphs="auto")
    prepared = bench_overlap._prepare(args, "overlap_cap", 2, 1, 1)
    assert prepared["fields"]["convolution_graphs"] is True
    assert compiles == [(1, options, True), (2, options, True)]
    # A priming step for each executable, then the warm-up step: +1 each.
    assert float(prepared["state"].params) == 3
    compiles.clear()
    plain = bench_overlap._prepare(argparse.Namespace(
        warmup_steps=1, loop_timing=False, convolution_graphs="never"), "overlap_cap", 2, 1, 1)
    assert plain["fields"]["convolution_graphs"] is False and float(plain["state"].params) == 1
    assert compiles == [(1, options, False)]


def test_the_told_overlap_variant_compiles_as_the_trainer_does_told():
    # `told` stands for the trainer's step across hosts: the XLA options it sets where the
    # network was told (`comm.tell_xla_network`) are the variant's, on the 64K config's buckets.
    from configs import resnet50_64k
    from jia_jax import train
    from scripts.bench import overlap as bench_overlap

    comm = resnet50_64k.get_config().comm
    assert comm.tell_xla_network
    variant = bench_overlap.VARIANTS["told"]
    assert set(variant) == {"xla"}
    assert train.step_compiler_options(comm, xla_told=True) == variant["xla"]


def _trace_event(pid, tid, name, ts, dur):
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}


# A host (pid 1) and one GPU (pid 7) whose stream 3 holds the kernels.
_TRACE_META = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
               {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
               {"ph": "M", "pid": 7, "tid": 3, "name": "thread_name",
                "args": {"name": "Stream #3(Compute)"}}]


def _write_process_trace(workdir, process, events):
    """A trainer's trace of process `process` where `config.profile` writes it."""
    run = pathlib.Path(workdir) / "profile" / f"process_{process}" / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    with gzip.open(run / "h.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": _TRACE_META + events}, f)


def test_bench_hosts_steady_figures_leave_out_the_first_traced_step(tmp_path):
    """Two processes, 3 traced steps of 2 compute kernels each on stream 3; NCCL on stream 4.
    Process 0 started its trace first: its first all-reduce waits 20 µs alone for process 1.
    After that, each step leaves 1 µs of NCCL exposed on each GPU."""
    from scripts.bench import hosts as bench_hosts

    x = _trace_event
    stream4 = {"ph": "M", "pid": 7, "tid": 4, "name": "thread_name",
               "args": {"name": "Stream #4(Nccl)"}}

    def steps(first_wait):  # compute 10 µs, all-reduce beside the second kernel, per step
        events, t = [stream4], 0
        for wait in (first_wait, 0, 0):
            events += [x(7, 3, "loop_add_fusion", t, 10), x(7, 4, "ncclDevKernel_AllReduce",
                                                            t + 10, wait + 6),
                       x(7, 3, "loop_add_fusion", t + 10 + wait, 5)]
            t += 10 + wait + 6
        return events

    for process, wait in enumerate((20, 0)):
        _write_process_trace(tmp_path, process, steps(wait))
    got = bench_hosts.profile_figures(str(tmp_path), steps=3)
    # Whole trace: process 0 exposes 21 + 1 + 1 µs, process 1 1 + 1 + 1, over 3 steps.
    assert got["exposed_comm_ms"] == pytest.approx((23 / 3 + 3 / 3) / 2 / 1000)
    steady = got["steady"]
    assert steady["steps"] == 2
    assert steady["exposed_comm_ms"] == pytest.approx(1 / 1000)
    assert steady["span_ms"] == pytest.approx(16 / 1000) and steady["idle_ms"] == 0
    assert steady["compute_ms"] == pytest.approx(15 / 1000)


def test_bench_hosts_profile_figures_are_per_traced_step_with_each_process_launch(tmp_path):
    """A profiled row's figures from the trainer's traces (one per process): exposed NCCL and
    idle time per traced step averaged over the GPUs, how each GPU's kernels follow one another
    (by process), and each process's host time in the train step's calls (jax.jit's or the
    graphs executable's, not another jitted function's)."""
    from scripts.bench import hosts as bench_hosts

    x = _trace_event
    traces = [
        # Process 0: compute [0, 10] and [25, 30], NCCL [5, 20]: 10 µs exposed, 5 idle. Its
        # host: two step calls of 40 and 60 µs (a launch of 25 inside the first), and a call of
        # another function that does not count.
        [x(7, 3, "loop_add_fusion", 0, 10), x(7, 3, "ncclDevKernel_AllReduce", 5, 15),
         x(7, 3, "loop_add_fusion", 25, 5),
         x(1, 1, "PjitFunction(jit(step))", 0, 40), x(1, 1, "cuGraphLaunch (CudaGraph:4)", 5, 25),
         x(1, 1, "PjitFunction(step)", 100, 60), x(1, 1, "PjitFunction(crop_resize)", 200, 99)],
        # Process 1: compute [0, 30] only; one step call of 20 µs.
        [x(7, 3, "loop_add_fusion", 0, 30), x(1, 1, "PjitFunction(jit(step))", 0, 20)],
    ]
    for i, events in enumerate(traces):
        _write_process_trace(tmp_path, i, events)
    got = bench_hosts.profile_figures(str(tmp_path), steps=2)
    assert got["exposed_comm_ms"] == pytest.approx((10 / 2 + 0) / 2 / 1000)
    # Process 0's stream: the NCCL kernel starts 5 µs before the first ends, the last 5 µs
    # after it: two boundaries in 2 steps summing to 0; process 1's single kernel has none.
    first, second = got["boundaries"]
    assert (first["count_per_step"], first["negative_per_step"], first["sum_us_per_step"]) == (
        1.0, 0.5, 0.0)
    assert (second["count_per_step"], second["p50_us"]) == (0.0, None)
    assert got["idle_ms"] == pytest.approx((5 / 2 + 0) / 2 / 1000)
    # Compute: process 0's [0, 10] and [25, 30], process 1's [0, 30]; spans 30 and 30.
    assert got["compute_ms"] == pytest.approx((15 / 2 + 30 / 2) / 2 / 1000)
    assert got["span_ms"] == pytest.approx(30 / 2 / 1000)
    # loop_add_fusion is a fusion: 15 and 30 µs in 2 steps on the two GPUs; no conv/gemm.
    assert got["busy_ms"]["fusion"] == pytest.approx((15 / 2 + 30 / 2) / 2 / 1000)
    assert got["busy_ms"]["conv/gemm"] == 0
    assert got["launch_ms"] == pytest.approx([100 / 2 / 1000, 20 / 2 / 1000])
    assert got["launch"]["call_us_per_step"] == 50
    assert got["steady"] is None  # 3 kernels and 1 on the busiest streams: no 2 equal steps
    assert {r["name"]: r["us_per_step"] for r in got["launch"]["top"]} == {
        "PjitFunction(step)": 30, "cuGraphLaunch (CudaGraph:N)": 12.5,
        "PjitFunction(jit(step))": 7.5}
