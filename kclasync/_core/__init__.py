"""The sans-IO core: protocol decisions as pure functions of snapshots and time."""
