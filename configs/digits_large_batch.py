"""The large-batch study on digits: one recipe per config, all with the same epoch budget.

Recipes (pick one after the colon):
  small_sgd    batch 64, momentum SGD, short warmup, poly decay: the small-batch baseline.
  large_sgd    batch 512 (36% of the 1,437 training images), the baseline's learning rate scaled
               linearly (x8), no warmup: the naive way to grow the batch.
  large_lars   batch 512, LARS with warmup and poly decay (You et al. 2017; Jia et al. 2018).

Run one recipe on a simulated 2x4 mesh:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m jia_jax.main \
      --config=configs/digits_large_batch.py:large_lars --workdir=/tmp/jia_jax/digits_lars
The whole study (table + JSON): `python -m scripts.large_batch_digits`.
"""

import ml_collections

from configs import digits

RECIPES = ("small_sgd", "large_sgd", "large_lars")
SMALL_BATCH, LARGE_BATCH = 64, 512
EPOCHS = 12.0


def get_config(recipe: str = "large_lars") -> ml_collections.ConfigDict:
  """The digits config changed to `recipe`, one of `RECIPES`."""
  if recipe not in RECIPES:
    raise ValueError(f"recipe {recipe!r} is not one of {RECIPES}.")
  config = digits.get_config()
  config.num_epochs = EPOCHS
  config.optimizer.decay = "poly"
  config.optimizer.power = 2.0
  config.optimizer.end_learning_rate = 0.0
  # One eval at the end and no intermediate checkpoints: the study compares final accuracy.
  config.eval_every_steps = 10**9
  config.checkpoint_every_steps = 10**9
  config.log_every_steps = 10

  # `optimizer.learning_rate` = base_learning_rate * global_batch_size / 256 (configs/default.py),
  # so the batch change below is what scales it.
  if recipe == "small_sgd":
    config.global_batch_size = SMALL_BATCH
    config.optimizer.name = "sgd"
    config.optimizer.base_learning_rate = 0.4
    config.optimizer.warmup_epochs = 1.0
  elif recipe == "large_sgd":
    config.global_batch_size = LARGE_BATCH
    config.optimizer.name = "sgd"
    config.optimizer.base_learning_rate = 0.4
    config.optimizer.warmup_epochs = 0.0
  else:
    config.global_batch_size = LARGE_BATCH
    config.optimizer.name = "lars"
    config.optimizer.base_learning_rate = 4.0
    config.optimizer.trust_coefficient = 0.001
    config.optimizer.warmup_epochs = 3.0
  return config
