"""A small ResNet on scikit-learn's bundled digits: the CPU-friendly embedded default.

Trains on a simulated 2x4 mesh in well under two minutes on a laptop CPU, no download:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m jia_jax.main \
      --config=configs/digits.py --workdir=/tmp/jia_jax/digits
"""

import ml_collections

from configs import default


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.model = ml_collections.ConfigDict({"name": "resnet18", "width": 8, "small_inputs": True})
    config.data.name = "digits"
    config.data.image_size = 16
    config.global_batch_size = 64
    config.eval_batch_size = 128
    config.num_epochs = 12.0
    config.precision.compute = "float32"
    config.optimizer.name = "sgd"
    config.optimizer.base_learning_rate = 0.4
    config.optimizer.weight_decay = 5e-4
    config.optimizer.warmup_epochs = 1.0
    config.optimizer.decay = "cosine"
    config.loss.label_smoothing = 0.0
    config.mesh.node = 2
    config.mesh.gpu = 4
    config.log_every_steps = 40
    config.eval_every_steps = 200
    config.checkpoint_every_steps = 200
    config.checkpoint_keep = 2
    return config
