"""Vocabulary-parallel PIT modules with one known sharding bug each (the shard contract's factory `make`).

Each subclasses the reference pitcheck.nn_sharded.ShardedPIT and changes one piece;
tests/model/sharded/test_nn_sharded.py shows which sharded metric catches it.
"""
