"""The held-lease state machine and the explanation of refused writes, without asyncio."""

from __future__ import annotations

import attrs
import pytest

from kclasync._core.leases.held_lease import (
    TRANSITIONS,
    Event,
    FailedWrite,
    HeldLease,
    HeldLeaseError,
    HeldState,
    IncomingStep,
    Verdict,
    check_accepted_write,
    credits_renewal,
    explain_failed_write,
    incoming_step,
    is_stale,
    next_state,
    outgoing_timed_out,
    release_reason,
)
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import SHARD_END, Checkpoint

ME = "me"
HELD = Lease(key="L", owner=ME, counter=5, checkpoint=Checkpoint("100"))


def explain(
    current: Lease | None,
    write: FailedWrite | None = None,
    state: HeldState = HeldState.ACTIVE,
    held: Lease = HELD,
) -> Verdict:
    return explain_failed_write(
        me=ME, state=state, held=held, current=current, write=write or FailedWrite.renewal()
    )


# -- transitions ------------------------------------------------------------------------------


def test_the_handoff_edges() -> None:
    assert next_state(HeldState.INCOMING, Event.HANDOFF_DONE) is HeldState.ACTIVE
    assert next_state(HeldState.ACTIVE, Event.HANDOFF_AWAY) is HeldState.OUTGOING
    for state in (HeldState.ACTIVE, HeldState.INCOMING, HeldState.OUTGOING):
        assert next_state(state, Event.LOSE) is HeldState.LOST
        assert next_state(state, Event.RELEASE) is HeldState.RELEASED


@pytest.mark.parametrize("final", [HeldState.LOST, HeldState.RELEASED])
@pytest.mark.parametrize("event", list(Event))
def test_final_states_have_no_way_out(final: HeldState, event: Event) -> None:
    with pytest.raises(HeldLeaseError, match=final.value):
        next_state(final, event)


def test_edges_the_rules_lack_are_refused() -> None:
    with pytest.raises(HeldLeaseError):
        next_state(HeldState.ACTIVE, Event.HANDOFF_DONE)  # an active lease is not incoming
    with pytest.raises(HeldLeaseError):
        next_state(HeldState.OUTGOING, Event.HANDOFF_AWAY)
    assert len(TRANSITIONS) == 9


# -- renewal ----------------------------------------------------------------------------------


def test_a_renewal_whose_earlier_attempt_went_through_is_ours_but_does_not_credit() -> None:
    current = attrs.evolve(HELD, counter=6)
    assert explain(current) is Verdict.OURS
    assert not credits_renewal(Verdict.OURS, FailedWrite.renewal())
    assert credits_renewal(None, FailedWrite.renewal())


def test_a_renewal_beaten_by_another_worker_is_lost() -> None:
    assert explain(attrs.evolve(HELD, owner="other", counter=6)) is Verdict.LOST
    assert explain(attrs.evolve(HELD, counter=7)) is Verdict.LOST  # someone else bumped it
    assert explain(None) is Verdict.LOST  # deleted


def test_a_renewal_that_finds_a_handoff_asked_of_us_goes_outgoing() -> None:
    current = attrs.evolve(HELD, owner="new", checkpoint_owner=ME, counter=6)
    assert explain(current) is Verdict.HANDOFF_STARTED
    # OUTGOING leases are not renewed, so that verdict is only reached from ACTIVE.


def test_incoming_renewals_follow_the_old_owner() -> None:
    held = attrs.evolve(HELD, checkpoint_owner="old")
    finished = attrs.evolve(held, checkpoint_owner=None, counter=7)
    checkpointed = attrs.evolve(held, counter=7)
    assert explain(finished, state=HeldState.INCOMING, held=held) is Verdict.HANDOFF_PROGRESS
    assert explain(checkpointed, state=HeldState.INCOMING, held=held) is Verdict.HANDOFF_PROGRESS
    handed_on = attrs.evolve(held, owner="third", checkpoint_owner=ME, counter=7)
    assert explain(handed_on, state=HeldState.INCOMING, held=held) is Verdict.PASS_ON
    stolen = attrs.evolve(held, owner="third", checkpoint_owner=None, counter=7)
    assert explain(stolen, state=HeldState.INCOMING, held=held) is Verdict.LOST


# -- checkpoint -------------------------------------------------------------------------------


def test_a_retried_checkpoint_is_ours_only_if_the_table_holds_what_we_wrote() -> None:
    write = FailedWrite.of_checkpoint(HELD, Checkpoint("200"), None)
    assert explain(attrs.evolve(HELD, counter=6, checkpoint=Checkpoint("200")), write) is (
        Verdict.OURS
    )
    assert explain(attrs.evolve(HELD, counter=6, checkpoint=Checkpoint("150")), write) is (
        Verdict.LOST
    )
    assert credits_renewal(Verdict.OURS, write)


def test_a_pending_checkpoint_is_ours_only_if_the_pending_value_is_there() -> None:
    write = FailedWrite.of_checkpoint(HELD, HELD.checkpoint, Checkpoint("300"))
    assert write.checkpoint == HELD.checkpoint
    pending = attrs.evolve(HELD, counter=6, pending_checkpoint=Checkpoint("300"))
    assert explain(pending, write) is Verdict.OURS
    # The counter moved but nothing we wrote is there: a renewal of ours went through.
    assert explain(attrs.evolve(HELD, counter=6), write) is Verdict.RETRY


def test_a_checkpoint_after_a_renewal_whose_reply_was_lost_is_retried_not_lost() -> None:
    write = FailedWrite.of_checkpoint(HELD, Checkpoint("200"), None)
    renewed = attrs.evolve(HELD, counter=6)  # our renewal landed; we never saw the reply
    assert explain(renewed, write) is Verdict.RETRY
    assert explain(attrs.evolve(renewed, counter=7), write) is Verdict.LOST  # two writes: not ours
    child_write = FailedWrite.of_child_shard_ids(frozenset({"c1"}))
    assert explain(renewed, child_write) is Verdict.RETRY


def test_a_checkpoint_that_finds_a_handoff_checkpoints_as_the_old_owner() -> None:
    write = FailedWrite.of_checkpoint(HELD, SHARD_END, None)
    current = attrs.evolve(HELD, owner="new", checkpoint_owner=ME, counter=6)
    assert explain(current, write) is Verdict.HANDOFF_STARTED


# -- childShardIds ----------------------------------------------------------------------------


def test_child_shard_ids_are_ours_or_not_written() -> None:
    write = FailedWrite.of_child_shard_ids(frozenset({"c1", "c2"}))
    ours = attrs.evolve(HELD, counter=6, child_shard_ids=frozenset({"c1", "c2"}))
    assert explain(ours, write) is Verdict.OURS
    assert explain(attrs.evolve(ours, child_shard_ids=frozenset({"c1"})), write) is Verdict.LOST
    # A handoff asked of us does not make a childShardIds write go outgoing.
    asked = attrs.evolve(HELD, owner="new", checkpoint_owner=ME, counter=6)
    assert explain(asked, write) is Verdict.LOST


# -- deadlines --------------------------------------------------------------------------------


def test_staleness_and_outgoing_timeout_are_strictly_after_the_bound() -> None:
    assert not is_stale(renewed_at=100.0, now=110.0, failover_time=10.0)
    assert is_stale(renewed_at=100.0, now=110.5, failover_time=10.0)
    assert not outgoing_timed_out(since=0.0, now=30.0, handoff_timeout=30.0)
    assert outgoing_timed_out(since=0.0, now=30.1, handoff_timeout=30.0)


def test_incoming_waits_activates_or_forces() -> None:
    waiting = attrs.evolve(HELD, checkpoint_owner="old")

    def step(lease: Lease, now: float, live: bool = True) -> IncomingStep:
        return incoming_step(
            lease,
            since=0.0,
            now=now,
            handoff_timeout=30.0,
            old_owner_live=live,
            worker_failover=10.0,
        )

    assert step(waiting, 5.0) is IncomingStep.WAIT
    assert step(attrs.evolve(waiting, checkpoint_owner=None), 5.0) is IncomingStep.ACTIVATE
    assert step(waiting, 31.0) is IncomingStep.FORCE
    # An old owner that stopped heartbeating is not waited for until the handoff timeout.
    assert step(waiting, 11.0, live=False) is IncomingStep.FORCE
    assert step(waiting, 9.0, live=False) is IncomingStep.WAIT


def test_sticky_release_reasons() -> None:
    assert release_reason(HELD, ME) is None
    assert release_reason(attrs.evolve(HELD, sticky=20), ME) == "Sticky=20"
    pinned = attrs.evolve(HELD, sticky=10, sticky_worker="other")
    assert release_reason(pinned, ME) == "pinned to other"
    assert release_reason(attrs.evolve(pinned, sticky_worker=ME), ME) is None


def test_an_accepted_write_whose_item_names_another_owner_is_acted_on() -> None:
    mine = Lease(key="k", owner="a", counter=3)
    asked = attrs.evolve(mine, owner="b", checkpoint_owner="a")
    taken = attrs.evolve(mine, owner="b")
    active = HeldState.ACTIVE
    assert check_accepted_write(me="a", state=active, written=mine) is None
    assert check_accepted_write(me="a", state=active, written=asked) is Verdict.HANDOFF_STARTED
    assert check_accepted_write(me="a", state=active, written=taken) is Verdict.LOST
    # Handoff states expect these items: the new owner renews with checkpointOwner set, the
    # old one checkpoints a lease that names the new owner.
    incoming = attrs.evolve(mine, checkpoint_owner="z")
    assert check_accepted_write(me="a", state=HeldState.INCOMING, written=incoming) is None
    assert check_accepted_write(me="a", state=HeldState.OUTGOING, written=asked) is None


# -- the state object ---------------------------------------------------------------------------


def test_a_held_lease_enters_the_machine_taken_or_incoming() -> None:
    taken = HeldLease.taken(HELD, sent=3.0)
    assert (taken.state, taken.renewed_at, taken.since, taken.lost) == (
        HeldState.ACTIVE,
        3.0,
        0.0,
        False,
    )
    incoming = HeldLease.incoming(HELD, sent=4.0)
    assert (incoming.state, incoming.since, incoming.watch_only) == (HeldState.INCOMING, 4.0, False)
    watched = HeldLease.incoming(HELD, sent=5.0, watch_only=True)
    assert watched.watch_only and watched.progress_at == 5.0


def test_events_move_the_state_and_final_states_refuse_more() -> None:
    held = HeldLease.taken(HELD, sent=0.0)
    moved = attrs.evolve(HELD, owner="other", checkpoint_owner=ME)
    held.handed_away(moved, now=7.0)
    assert (held.state, held.since, held.lease) == (HeldState.OUTGOING, 7.0, moved)
    assert held.apply(Event.RELEASE) is HeldState.OUTGOING and held.lost
    with pytest.raises(HeldLeaseError):
        held.apply(Event.LOSE)


def test_a_renewal_credits_its_send_time_only_when_accepted_at_once() -> None:
    held = HeldLease.taken(HELD, sent=0.0)
    held.bytes_delivered = 300
    renewed = attrs.evolve(HELD, counter=6)
    held.renewal_done(renewed, sent=3.0, verdict=None, delivered=200)
    assert (held.lease, held.renewed_at, held.bytes_delivered, held.throughput_since) == (
        renewed,
        3.0,
        100,
        3.0,
    )
    adopted = attrs.evolve(HELD, counter=7)
    held.renewal_done(adopted, sent=6.0, verdict=Verdict.OURS, delivered=100)
    # Reconciled: the write that counted was sent earlier; nothing credited at 6.0.
    assert (held.lease, held.renewed_at, held.bytes_delivered, held.throughput_since) == (
        adopted,
        3.0,
        100,
        3.0,
    )
