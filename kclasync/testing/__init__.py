"""Support for tests, demos and simulations: an in-memory backend, local AWS emulators and
helpers.

``MemoryBackend`` runs a ``Consumer`` on an in-memory lease table and streams: no AWS, no
emulator (see docs/testing.md).

The emulators need moto, which comes with the ``demo`` extra (``pip install 'kclasync[demo]'``);
without it they raise ``MissingExtraError`` saying so.
"""

from kclasync.testing.backend import MemoryBackend
from kclasync.testing.emulators import (
    LocalAws,
    MissingExtraError,
    embedded_moto,
    kinesis_local,
    moto_process,
)

__all__ = [
    "LocalAws",
    "MemoryBackend",
    "MissingExtraError",
    "embedded_moto",
    "kinesis_local",
    "moto_process",
]
