"""Support for tests, demos and simulations: local AWS emulators and helpers."""
