"""jia_jax: large-batch data-parallel ImageNet training in JAX (after Jia et al. 2018).

The LARS optimizer is usable on its own from any JAX project:

    from jia_jax import lars
    tx = lars(learning_rate=schedule, weight_decay=1e-4)
"""

from jia_jax.lars import exclude_bias_and_norm, lars, scale_by_lars

__all__ = ["exclude_bias_and_norm", "lars", "scale_by_lars"]
