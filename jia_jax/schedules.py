"""Large-batch learning-rate recipe: linear scaling, linear warmup, polynomial or cosine decay.

Goyal et al. 2017 (https://arxiv.org/abs/1706.02677): scale the learning rate linearly with the
batch and warm it up over the first epochs. You et al. 2017 and Jia et al. 2018 then decay it
polynomially (power 2) to the end of training.
"""

import ml_collections
import optax

_DECAYS = ("poly", "cosine")


def scaled_learning_rate(base_lr: float, global_batch: int, base_batch: int = 256) -> float:
    """Linear scaling rule: `base_lr * global_batch / base_batch`.

    Args:
      base_lr: learning rate tuned for `base_batch` examples per step.
      global_batch: examples per step summed over all devices.
      base_batch: the batch `base_lr` belongs to (256 for ImageNet, as in Goyal et al.).

    Returns:
      The learning rate for `global_batch`.
    """
    return base_lr * global_batch / base_batch


def steps_per_epoch(num_examples: int, global_batch: int) -> float:
    """Steps per pass over `num_examples`, not rounded (ImageNet at batch 65536: 19.55).

    Fractional, so that `epochs * steps_per_epoch(...)` is rounded once, at the end.

    Raises:
      ValueError: if either argument is not positive.
    """
    if num_examples <= 0:
        raise ValueError(f"the training split must hold examples, got {num_examples}")
    if global_batch <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch}")
    return num_examples / global_batch


def create_learning_rate_schedule(
    peak_lr: float,
    total_steps: int,
    warmup_steps: int,
    decay: str = "poly",
    power: float = 2.0,
    end_lr: float = 0.0,
) -> optax.Schedule:
    """Linear warmup from 0 to `peak_lr`, then decay to `end_lr` at `total_steps`.

    With `t` the step (the optimizer's update count, starting at 0):
    - `t < warmup_steps`: `peak_lr * t / warmup_steps` (step 0 uses 0, as optax.linear_schedule);
    - after that, with `p = (t - warmup_steps) / (total_steps - warmup_steps)` clipped to 1:
      'poly': `end_lr + (peak_lr - end_lr) * (1 - p) ** power`;
      'cosine': `end_lr + (peak_lr - end_lr) * (1 + cos(pi * p)) / 2`.

    Args:
      peak_lr: learning rate at the end of warmup (already linearly scaled).
      total_steps: training length; the schedule stays at `end_lr` from here on.
      warmup_steps: warmup length, 0 for none; less than `total_steps`.
      decay: 'poly' or 'cosine'.
      power: exponent of the 'poly' decay; 'cosine' ignores it.
      end_lr: final learning rate.

    Returns:
      An `optax.Schedule` (step count -> fp32 learning rate).

    Raises:
      ValueError: naming the config field that holds a bad value.
    """
    if decay not in _DECAYS:
        raise ValueError(f"optimizer.decay must be one of {_DECAYS}, got {decay!r}")
    if peak_lr <= 0:
        raise ValueError(
            f"optimizer.learning_rate must be positive, got {peak_lr} (by default "
            "optimizer.base_learning_rate x global_batch_size / 256: set either)"
        )
    if end_lr < 0:
        raise ValueError(f"optimizer.end_learning_rate must be >= 0, got {end_lr}")
    if decay == "poly" and power <= 0:
        raise ValueError(f"optimizer.power must be positive for the 'poly' decay, got {power}")
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"optimizer.warmup_epochs gives {warmup_steps} warmup steps; it must be >= 0 and "
            f"shorter than total_steps ({total_steps}); for a short run set "
            "--config.optimizer.warmup_epochs=0 (or a fraction of an epoch)."
        )
    decay_steps = total_steps - warmup_steps
    warmup = optax.linear_schedule(0.0, peak_lr, warmup_steps)
    if decay == "poly":
        tail = optax.polynomial_schedule(peak_lr, end_lr, power, decay_steps)
    else:
        tail = optax.cosine_decay_schedule(peak_lr, decay_steps, alpha=end_lr / peak_lr)
    return optax.join_schedules([warmup, tail], [warmup_steps])


def schedule_from_config(
    optimizer_cfg: ml_collections.ConfigDict,
    num_train_examples: int,
    global_batch: int,
    total_steps: int,
) -> optax.Schedule:
    """`create_learning_rate_schedule` from the `optimizer` config section.

    Reads `learning_rate` (the peak, already scaled), `warmup_epochs`, `decay`, `power` and
    `end_learning_rate`. Warmup steps are `round(warmup_epochs * num_train_examples /
    global_batch)`: warmup covers that many epochs' worth of examples.

    Args:
      optimizer_cfg: the `optimizer` sub-config.
      num_train_examples: size of the training split.
      global_batch: examples per step over all devices.
      total_steps: training length in steps.

    Returns:
      An `optax.Schedule`.

    Raises:
      ValueError: naming the config field that holds a bad value.
    """
    if optimizer_cfg.warmup_epochs < 0:
        raise ValueError(f"optimizer.warmup_epochs must be >= 0, got {optimizer_cfg.warmup_epochs}")
    warmup_steps = round(
        optimizer_cfg.warmup_epochs * steps_per_epoch(num_train_examples, global_batch)
    )
    return create_learning_rate_schedule(
        peak_lr=optimizer_cfg.learning_rate,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        decay=optimizer_cfg.decay,
        power=optimizer_cfg.power,
        end_lr=optimizer_cfg.end_learning_rate,
    )
