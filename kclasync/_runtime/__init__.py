"""The asyncio runtime: coordinator loops and per-shard pipelines."""
