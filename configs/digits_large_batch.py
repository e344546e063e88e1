"""The large-batch study on digits: one recipe per config, all for the same 12 epochs.

Recipes (pick one after the colon):
  small_sgd         batch 64, momentum SGD, 1 warmup epoch, cosine decay: the tuned baseline
                    (configs/digits.py).
  large_sgd         batch 512 (36% of the 1,437 training images), the baseline's learning rate
                    scaled linearly (x8) and no warmup: the naive way to grow the batch.
  large_sgd_warmup  large_sgd plus 2 warmup epochs (Goyal et al. 2017).
  large_lars        batch 512, LARS with 2 warmup epochs and poly-2 decay (You et al. 2017;
                    Jia et al. 2018).

Every recipe keeps the BatchNorm running averages over the same number of images: the momentum
is 0.9 per step of 64 images, so 0.9 ** 8 per step of 512 (with 0.9, the few large steps left
stale statistics; see docs/large_batch.md).

Run one recipe on a simulated 2x4 mesh:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m jia_jax.main \
      --config=configs/digits_large_batch.py:large_lars --workdir=/tmp/jia_jax/digits_lars
The whole study (table + JSON): `python -m scripts.large_batch_digits`.
"""

import ml_collections

from configs import digits

RECIPES = ("small_sgd", "large_sgd", "large_sgd_warmup", "large_lars")
SMALL_BATCH, LARGE_BATCH = 64, 512
EPOCHS = 12.0
BN_MOMENTUM = 0.9  # per SMALL_BATCH images


def get_config(recipe: str = "large_lars") -> ml_collections.ConfigDict:
    """The digits config changed to `recipe`, one of `RECIPES`."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r} is not one of {RECIPES}.")
    config = digits.get_config()
    config.num_epochs = EPOCHS
    # One eval at the end and no intermediate checkpoints: the study compares final accuracy.
    config.eval_every_steps = 10**9
    config.checkpoint_every_steps = 10**9
    config.log_every_steps = 10

    # `optimizer.learning_rate` = base_learning_rate * global_batch_size / 256 (configs/default.py),
    # so setting the batch is what scales it: 0.1 at 64, 0.8 at 512 for SGD.
    config.global_batch_size = SMALL_BATCH if recipe == "small_sgd" else LARGE_BATCH
    config.model.bn_momentum = BN_MOMENTUM ** (config.global_batch_size / SMALL_BATCH)
    if recipe == "large_sgd":
        config.optimizer.warmup_epochs = 0.0
    elif recipe == "large_sgd_warmup":
        config.optimizer.warmup_epochs = 2.0
    elif recipe == "large_lars":
        config.optimizer.name = "lars"
        config.optimizer.base_learning_rate = 2.0  # peak 4.0 at batch 512
        config.optimizer.trust_coefficient = 0.01
        config.optimizer.weight_decay = 5e-5
        config.optimizer.warmup_epochs = 2.0
        config.optimizer.decay = "poly"
        config.optimizer.power = 2.0
        config.optimizer.end_learning_rate = 0.0
    return config
