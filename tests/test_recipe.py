"""Tests for jia_jax.recipe: which config changes stop a resume, and how they are listed."""

import fnmatch
import json
import re

import pytest

from configs import default
from configs import digits
from jia_jax import recipe


def test_recipe_changes_list_old_and_new_values_but_not_free_fields():
    saved = recipe.of_run(
        json.dumps(
            {
                "seed": 0,
                "total_steps": 100,
                "log_every_steps": 10,
                "mesh": {"node": 2, "gpu": 4},
                "comm": {"strategy": "flat", "dtype": "float32"},
                "optimizer": {"learning_rate": 0.1, "name": "sgd"},
            }
        ),
        num_devices=8,
    )
    current = recipe.of_run(
        json.dumps(
            {
                "seed": 0,
                "total_steps": 200,
                "log_every_steps": 1,
                "mesh": {"node": 1, "gpu": 4},
                "comm": {"strategy": "hierarchical", "dtype": "bfloat16"},
                "optimizer": {"learning_rate": 0.1, "name": "lars", "trust_coefficient": 0.001},
            }
        ),
        num_devices=4,
    )
    assert recipe.changes(saved, current) == [
        "comm.dtype: 'float32' -> 'bfloat16'",
        "num_devices: 8 -> 4",
        "optimizer.name: 'sgd' -> 'lars'",
        "optimizer.trust_coefficient: (absent) -> 0.001",
        "total_steps: 100 -> 200",
    ]


def test_every_free_field_exists_in_the_default_config():
    # A renamed config field would otherwise silently become a compared one.
    fields = recipe.of_run(default.get_config().to_json(), num_devices=8)
    for pattern in recipe.FREE_ON_RESUME:
        assert any(fnmatch.fnmatchcase(name, pattern) for name in fields), pattern


def digits_meta(config, num_devices=8):
    return {"step": 5, "seed": config.seed, "config": config.to_json(), "num_devices": num_devices}


def test_changed_recipe_stops_unless_allowed(caplog):
    config = digits.get_config()
    meta = digits_meta(config)
    config.optimizer.base_learning_rate = 0.8  # the derived learning_rate follows
    config.mesh.node, config.mesh.gpu = 4, 2
    config.data.data_dir = "/elsewhere"
    current = recipe.of_run(config.to_json(), num_devices=8)
    kwargs = {"step": 5, "directory": "/ckpt"}
    with pytest.raises(recipe.ConfigChangedError) as info:
        recipe.check_resume(meta, current, allow_change=False, **kwargs)
    message = str(info.value)
    assert "checkpoint of step 5 in /ckpt" in message
    # Exactly the two changed values, old -> new; the mesh and data_dir may change freely.
    assert re.findall(r"\n  (.*)", message) == [
        "optimizer.base_learning_rate: 0.4 -> 0.8",
        "optimizer.learning_rate: 0.1 -> 0.2",
    ]
    assert "--config.allow_config_change=True" in message

    with caplog.at_level("WARNING"):
        recipe.check_resume(meta, current, allow_change=True, **kwargs)
    assert "optimizer.base_learning_rate: 0.4 -> 0.8" in caplog.text


def test_same_recipe_on_another_device_count_is_a_change():
    config = digits.get_config()
    current = recipe.of_run(config.to_json(), num_devices=8)
    recipe.check_resume(digits_meta(config), current, allow_change=False, step=5, directory="/c")
    with pytest.raises(recipe.ConfigChangedError, match="num_devices: 16 -> 8"):
        recipe.check_resume(
            digits_meta(config, num_devices=16), current, allow_change=False, step=5, directory="/c"
        )


def test_model_options_are_free_on_resume():
    """A checkpoint from before the options existed resumes with them on (same function)."""
    config = default.get_config()
    current = recipe.of_run(config.to_json(), num_devices=8)
    options = ("space_to_depth_stem", "sliced_max_pool")
    for option in options:
        del config.model[option]
    meta = {"step": 5, "seed": 0, "config": config.to_json(), "num_devices": 8}
    assert current["model.sliced_max_pool"] is True  # the default
    recipe.check_resume(meta, current, allow_change=False, step=5, directory="/c")
    current["model.bn_momentum"] = 0.99  # other model fields stay compared
    with pytest.raises(recipe.ConfigChangedError, match="model.bn_momentum"):
        recipe.check_resume(meta, current, allow_change=False, step=5, directory="/c")


def test_retired_fields_of_an_older_checkpoint_resume_as_absent():
    """A checkpoint saved while `comm.backward_cuts` / `model.weight_grads_first` /
    `xla.command_buffer_convolutions` / `comm.deferred_buckets` / `model.input_moments` /
    `model.pointwise_as_dot` existed resumes on today's config (which has none of them) without `allow_config_change`; other
    changes still stop it."""
    config = digits.get_config()
    old = json.loads(config.to_json())
    old["comm"]["backward_cuts"] = [3, 4]
    old["comm"]["deferred_buckets"] = 1
    old["model"]["input_moments"] = False
    old["model"]["pointwise_as_dot"] = True
    old["model"]["weight_grads_first"] = True
    old["xla"] = {"command_buffer_convolutions": True}  # a block of its own, now gone
    meta = {**digits_meta(config), "config": json.dumps(old)}
    current = recipe.of_run(config.to_json(), num_devices=8)
    recipe.check_resume(meta, current, allow_change=False, step=5, directory="/ckpt")
    old["seed"] = config.seed + 1
    with pytest.raises(recipe.ConfigChangedError, match="seed"):
        recipe.check_resume(
            {**meta, "config": json.dumps(old)}, current, allow_change=False, step=5,
            directory="/ckpt",
        )


@pytest.mark.parametrize("fused_bn", [True, False])
def test_checkpoint_with_the_retired_fused_bn_resumes_on_todays_config(fused_bn):
    """`model.fused_bn` was on in the default config (off in AlexNet-BN's) until it was removed:
    such a checkpoint resumes on today's config, which has no such field, without
    `allow_config_change`, and it is not listed beside a change that does stop the run."""
    config = default.get_config()
    assert "fused_bn" not in config.model
    old = json.loads(config.to_json())
    old["model"]["fused_bn"] = fused_bn
    meta = {"step": 5, "seed": 0, "config": json.dumps(old), "num_devices": 8}
    current = recipe.of_run(config.to_json(), num_devices=8)
    recipe.check_resume(meta, current, allow_change=False, step=5, directory="/ckpt")
    current["seed"] = 1
    with pytest.raises(recipe.ConfigChangedError) as info:
        recipe.check_resume(meta, current, allow_change=False, step=5, directory="/ckpt")
    assert re.findall(r"\n  (.*)", str(info.value)) == ["seed: 0 -> 1"]
