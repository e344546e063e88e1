"""Test setup: 8 simulated CPU devices, so SPMD code runs on a 2x4 mesh without GPUs."""

import os

# Must happen before jax is imported anywhere in the test process.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
