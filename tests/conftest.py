"""Test setup: 8 simulated CPU devices, so SPMD code runs on a 2x4 mesh without GPUs."""

import os

# Must happen before jax is imported anywhere in the test process; subprocesses inherit it.
# Without LLVM's optimisation passes the CPU programs compile several times faster, which is most
# of the suite's time on a 2-core machine; the arithmetic is the same IEEE fp32.
os.environ["XLA_FLAGS"] = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),
        "--xla_force_host_platform_device_count=8",
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
    ]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
