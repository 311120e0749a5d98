"""Lineage: shards and the leases the shard graph calls for.

Shards as the stream describes them (``shard``), stream identities and multi-stream lease keys
(``streams``), which leases a shard sync creates for an initial position (``shard_lineage``), and
at shard end the child leases a finished parent needs and when a child may start
(``shard_end``): a child is never processed before its parents are finished. Pure.
"""
