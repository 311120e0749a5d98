"""Leases: what a lease row is and every rule about one lease.

The lease value and its item's meaning (``lease``, ``position``), the condition and update of
every lease-table write (``lease_rules``), the held-lease state machine and what a refused write
means (``held_lease``), expiry on this worker's own clock (``expiry``), which checkpoints are
allowed (``checkpoint_rules``), the protocol's periods (``periods``), the leader lock
(``leader_lock``), the Java KCL's migration state (``client_version``) and when a finished lease
may be deleted (``lease_cleanup``). Pure: values in, decisions out; no I/O, no clock.
"""
