"""Support for tests, demos and simulations: local AWS emulators and helpers.

The emulators need moto, which comes with the ``demo`` extra (``pip install 'kclasync[demo]'``);
without it they raise ``MissingExtraError`` saying so.
"""

from kclasync.testing.emulators import (
    LocalAws,
    MissingExtraError,
    embedded_moto,
    kinesis_local,
    moto_process,
)

__all__ = ["LocalAws", "MissingExtraError", "embedded_moto", "kinesis_local", "moto_process"]
