"""Vocabulary-parallel (row-sharded) PIT on torch.distributed: layout, launcher, distributed retractions
and sharded metrics. See pitcheck.nn_sharded for the reference module.

Importing this package imports torch (pitcheck itself stays light).
"""
from .comm import ALLREDUCE_DTYPES, all_reduce_sum, allreduce_dtype, assemble_rows, rank_and_size  # noqa: F401
from .processes import (DEFAULT_TIMEOUT_S, ShardedPool, ShardedRunError, default_backend,  # noqa: F401
                     ensure_process_group, launch)
from .layout import ShardLayout, scatter_rows, shard_layout  # noqa: F401
from .metrics import (gram_deviation, orthonormality, orthonormality_ratio, pinv_drift,  # noqa: F401
                      pit_pinv_drift, relative_distance, replica_spread, shard_distance)
from .retractions import (SHARDED_RETRACTIONS, get_sharded_retraction, global_norm, gram,  # noqa: F401
                          tangent_projection, tsqr)
