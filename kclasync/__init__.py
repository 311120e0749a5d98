"""kclasync: the KCL lease protocol, natively in asyncio.

Everything a user needs is importable from here.
"""

from kclasync.adapters.aws import ClientOptions
from kclasync.adapters.protocols import ThrottledError, TransientError
from kclasync.config import ConsumerConfig, ProcessorErrorPolicy
from kclasync.consumer import Consumer
from kclasync.core.position import Checkpoint, InitialPosition
from kclasync.errors import (
    CheckpointError,
    ConfigError,
    InvalidCheckpointError,
    KclAsyncError,
    LeaseLostError,
    ProcessorFailedError,
    ShutdownCheckpointError,
    StreamNotFoundError,
)
from kclasync.processor import Checkpointer, RecordProcessor, ShardInfo
from kclasync.records import Record

__version__ = "0.1.0"

__all__ = [
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
    "ShardInfo",
    "ShutdownCheckpointError",
    "StreamNotFoundError",
    "ThrottledError",
    "TransientError",
]
