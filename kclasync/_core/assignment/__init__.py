"""Assignment: which worker holds which lease.

Every worker's own taking (``lease_taker`` for the KCL 2.x rules, ``balanced_taker`` for
kclasync's one-round balance, ``startup`` for when a starting worker first takes) and the
leader-based planners (``kcl3_decider``, ``load_balancer`` over the fleet view of
``load_assignment``), what a leader writes and a follower does with it
(``assignment_decisions``), and the load they reason about (``capacity``, ``cpu_usage``). Pure:
a snapshot of the table and the fleet in, a plan out.
"""
