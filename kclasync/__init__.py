"""kclasync: the KCL lease protocol, natively in asyncio.

Everything a user needs is importable from here.
"""

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.backends import AWSBackend, Backend
from kclasync._batches import BatchIterator, ShardBatch
from kclasync._config import ConsumerConfig, ProcessorErrorPolicy
from kclasync._consumer import Consumer
from kclasync._core.leases.position import Checkpoint, InitialPosition
from kclasync._processor import Checkpointer, RecordProcessor, ShardInfo
from kclasync._records import Record
from kclasync.errors import (
    CheckpointError,
    ConfigError,
    InvalidCheckpointError,
    KclAsyncError,
    LeaseLostError,
    ProcessorFailedError,
    ShutdownCheckpointError,
    StreamNotFoundError,
    ThrottledError,
    TransientError,
)

__version__ = "0.1.0"

__all__ = [
    "AWSBackend",
    "Backend",
    "BatchIterator",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "ClientOptions",
    "ConfigError",
    "Consumer",
    "ConsumerConfig",
    "InitialPosition",
    "InvalidCheckpointError",
    "KclAsyncError",
    "LeaseLostError",
    "ProcessorErrorPolicy",
    "ProcessorFailedError",
    "Record",
    "RecordProcessor",
    "ShardBatch",
    "ShardInfo",
    "ShutdownCheckpointError",
    "StreamNotFoundError",
    "ThrottledError",
    "TransientError",
]
