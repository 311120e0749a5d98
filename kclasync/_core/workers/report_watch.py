"""The leader's watch of the registry reports between its assignment runs (leader-based modes).

In the leader-based modes (``lease_taker`` ``load`` and ``kcl3``) a kclasync worker writes its
registry entry with each renewal round (every renewer interval, failover / 3 - epsilon), and
writes no heartbeat. The leader alone reads the registry a few times per report period
(``WATCHES_PER_REPORT``) and notices a worker whose ``lut`` stood still past its report period
plus a margin (``suspect_after``): a suspect. It then reads that worker's leases strongly and
judges them by their own counters (``worker_silence.judge_silent_leases``), so that a crashed
worker's leases are assigned about 1.2-1.4 x the failover time after the crash, not at the
first assignment run (every 2 x failover) after a failover time of watching (2-4 x). The
report only says where to look: what is taken is decided by the counters alone, so a live
worker whose registry writes fail but whose renewals succeed keeps its leases.

Owns: the view of reports (``ReportView``, ``watch_reports``), when a standing report makes its
worker a suspect (``suspect_after``; the lock's previous owner at once:
``suspect_previous_leader``), how often the leader reads (``watch_interval``) and what a
assignment run plans with (``failover_view``, ``stalled_workers``).
Must not: judge lease expiry (``core.expiry``), plan (``core.assignment``), read a clock or do
I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from kclasync._core.assignment.assignment_decisions import renewing_owners
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import KCLASYNC, WorkerMetrics

#: The leader reads the registry this many times per report period (the renewer interval).
WATCHES_PER_REPORT = 6
#: A report may come this share of its period late before its worker is a suspect ...
SUSPECT_MARGIN = 0.15
#: ... and at least this many seconds (a write delayed by a busy loop or a slow request).
MIN_MARGIN = 0.5
#: ``lut`` carries whole seconds: reports less than this apart may carry the same value.
LUT_RESOLUTION = 1.0


def watch_interval(report_period: float) -> float:
    """How often the leader reads the registry between its runs."""
    return report_period / WATCHES_PER_REPORT


def lut_period(report_period: float) -> float:
    """The longest a live worker's ``lut`` stays the same: its report period, or, for periods
    under a second, the whole number of periods that spans a second (two reports within one
    second carry the same value)."""
    if report_period >= LUT_RESOLUTION:
        return report_period
    return report_period * math.ceil(LUT_RESOLUTION / report_period)


def suspect_after(report_period: float) -> float:
    """How long a kclasync worker's ``lut`` may stand still on the leader's clock, from the
    leader's first read of it, before the leader reads that worker's leases: the longest a
    live worker's ``lut`` stays the same (``lut_period``) and a margin (15 % of the period, at
    least half a second). A suspicion that proves false costs the reads of that worker's
    leases, nothing else: what is taken is judged from their counters."""
    return lut_period(report_period) + max(SUSPECT_MARGIN * report_period, MIN_MARGIN)


@attrs.frozen
class Report:
    """A worker's ``lut`` as the leader last read it."""

    lut: int
    #: The leader's local time of its first read of ``lut``.
    since: float
    #: Already a suspect (reported once, until ``lut`` moves again).
    suspect: bool = False


@attrs.frozen
class ReportView:
    reports: Mapping[str, Report] = attrs.field(factory=dict)

    def is_suspect(self, worker: str) -> bool:
        report = self.reports.get(worker)
        return report is not None and report.suspect

    def suspects(self) -> frozenset[str]:
        return frozenset(w for w, report in self.reports.items() if report.suspect)


@attrs.frozen
class ReportChange:
    view: ReportView
    #: Workers that just became suspects: read their leases now.
    suspects: frozenset[str] = frozenset()


def watch_reports(
    previous: ReportView,
    entries: Iterable[WorkerMetrics],
    me: str,
    now: float,
    *,
    report_period: float,
    sent: float | None = None,
) -> ReportChange:
    """Fold a read of the registry (sent at ``sent``, default ``now``, answered at ``now``)
    into the view. A new ``lut`` is stamped ``now``; standing still is measured up to ``sent``,
    so a slow read never makes a report look late. Watched: kclasync entries without a
    heartbeat (those report with their renewals); not this worker's own, nor another
    implementation's (a Java worker reports every 30 s: its leases wait for the assignment
    run), nor entries with a heartbeat (early failover of the taker modes watches those).
    An entry that disappeared is forgotten."""
    asked = now if sent is None else sent
    limit = suspect_after(report_period)
    reports: dict[str, Report] = {}
    newly: set[str] = set()
    for entry in entries:
        worker = entry.worker_id
        if worker == me or entry.implementation != KCLASYNC or entry.heartbeat is not None:
            continue
        old = previous.reports.get(worker)
        if old is None or old.lut != entry.last_update:
            reports[worker] = Report(entry.last_update, now)
            continue
        if not old.suspect and asked - old.since > limit:
            old = attrs.evolve(old, suspect=True)
            newly.add(worker)
        reports[worker] = old
    return ReportChange(ReportView(reports), frozenset(newly))


def suspect_previous_leader(view: ReportView, previous: str | None, me: str) -> ReportChange:
    """A new leader that took the lock over from ``previous`` suspects it at once (after the
    first read of its term): the lock was taken because its heartbeat stood still for the
    lock's duration, far longer than ``suspect_after``. Its leases are then read at once
    rather than after a report period of watching; if its ``lut`` moves again (it released the
    lock alive), the suspicion ends as any other. No entry (it left the registry): nothing."""
    report = view.reports.get(previous) if previous is not None and previous != me else None
    if previous is None or report is None or report.suspect:
        return ReportChange(view)
    reports = {**view.reports, previous: attrs.evolve(report, suspect=True)}
    return ReportChange(ReportView(reports), frozenset({previous}))


def failover_view(
    leases: Sequence[Lease],
    live: Collection[str],
    suspects: Collection[str],
    expiry: ExpiryTracker,
    now: float,
) -> tuple[list[Lease], frozenset[str]]:
    """What an assignment run plans with: the leases and the live workers (the targets).

    The suspects are no targets: the leader's run-time liveness rule (``lut`` still for the
    worker timeout, seen at its runs) can still count a worker that crashed since the last run
    as live, and so can a lease of it whose counter moved for another reason (its old owner
    finishing a handoff to it); a plan would then give the crashed worker's expired leases
    back to it. The other owners of leases whose counter still moves stay live
    (``renewing_owners``). A suspect's leases that are not expired are left out of the plan
    altogether: their owner may still renew them (a worker whose registry writes fail), so no
    plan may take them, and with their owner no target they would otherwise count as leases
    without a live owner."""
    gone = frozenset(suspects)
    renewing = renewing_owners(leases, expiry, now)
    planned = [
        lease for lease in leases if lease.owner not in gone or expiry.is_expired(lease, now)
    ]
    return planned, (frozenset(live) | renewing) - gone


def stalled_workers(
    previous: Mapping[str, int],
    leases: Iterable[Lease],
    entries: Iterable[WorkerMetrics],
    expiry: ExpiryTracker,
    now: float,
) -> dict[str, int]:
    """The workers of another implementation (a Java KCL worker) that are no targets for now,
    each with the ``lut`` its entry had when it was found stalled.

    The report watch does not follow a Java worker's entry (it reports every 30 s), so the
    registry alone counts a dead Java worker live for two of its report periods (60 s) after
    the leader last saw its ``lut`` change; in that time a plan could give its expired leases
    back to it, where they would stall another failover time each run. Its leases tell
    sooner: a worker that holds unfinished leases and renews none of them (every one expired
    on the leader's clock) is stalled. It stays so, holding leases or not, until its entry's
    ``lut`` changes (a report after the stall: it lives), or the entry disappears. kclasync
    entries are left to the report watch; an owner without an entry is no target anyway."""
    others = {e.worker_id: e.last_update for e in entries if e.implementation != KCLASYNC}
    held: dict[str, bool] = {}
    for lease in leases:
        if lease.owner in others and not lease.is_finished:
            renewed = not expiry.is_expired(lease, now)
            held[lease.owner] = held.get(lease.owner, False) or renewed
    stalled = {w: lut for w, lut in previous.items() if others.get(w) == lut}
    stalled.update({w: others[w] for w, renewing in held.items() if not renewing})
    return stalled
