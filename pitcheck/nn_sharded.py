"""The reference vocabulary-parallel PIT module under the name users validate (`pitcheck validate
pitcheck.nn_sharded:make_sharded --shards N`); the code is pitcheck/model/nn_sharded.py."""
from .model.nn_sharded import SHARDED_PROJECTIVE, ShardedPIT, gather_logits, make_sharded  # noqa: F401
