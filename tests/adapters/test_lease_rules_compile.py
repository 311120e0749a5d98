"""How the lease-table and leader-lock write rules (``_core.leases.lease_rules``) compile to
DynamoDB requests: condition and update expressions, and exactly the attribute names and values
each uses. Pure: no server (``test_lease_rules_conformance.py`` runs the same rules on both
stores)."""

from __future__ import annotations

import re

import pytest

from kclasync._adapters.coordinator_state import LOCK_SCHEMA
from kclasync._adapters.dynamo_conditions import (
    compile_condition,
    compile_lease_write,
    compile_write,
)
from kclasync._adapters.lease_codec import FIELD_ATTRIBUTES
from kclasync._core.leases import lease_rules as rules
from tests.adapters.test_lease_rules_conformance import CP1, CP2, held


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (rules.create().condition, "attribute_not_exists(#leaseKey)"),
        (rules.renew(held()).condition, "#leaseCounter = :v0 AND #leaseOwner = :v1"),
        (
            rules.checkpoint(held(), CP1).condition,
            "#leaseCounter = :v0 AND #leaseOwner = :v1 AND attribute_not_exists(#checkpointOwner)",
        ),
        (rules.checkpoint(held(checkpoint_owner="x"), CP1).condition, "#checkpointOwner = :v0"),
        (
            rules.update_child_shard_ids(held(owner=None), frozenset({"x"})).condition,
            "#leaseCounter = :v0 AND attribute_not_exists(#leaseOwner)",
        ),
        (rules.set_sticky(10).condition, "attribute_exists(#leaseKey)"),
    ],
)
def test_conditions_compile_to_dynamodb_expressions(
    condition: rules.Condition, expected: str
) -> None:
    expression, names, values = compile_condition(condition)
    assert expression == expected
    assert set(names) == set(re.findall(r"#\w+", expression))
    assert set(values) == set(re.findall(r":\w+", expression))


WRITES = {
    "create": rules.create(),
    "renew": rules.renew(held()),
    "renew with throughput": rules.renew(held(), 12.5),
    "take": rules.take(held(), "b"),
    "release": rules.release(held()),
    "checkpoint": rules.checkpoint(held(), CP1),
    "checkpoint pending": rules.checkpoint(held(), CP1, CP2),
    "handoff checkpoint": rules.checkpoint(held(owner="b", checkpoint_owner="a"), CP1),
    "start handoff": rules.start_handoff(held(), "b"),
    "finish handoff": rules.finish_handoff(held(owner="b", checkpoint_owner="a")),
    "delete": rules.delete(held()),
    "childShardIds": rules.update_child_shard_ids(held(), frozenset({"x", "y"})),
    "sticky": rules.set_sticky(10, "b"),
    "sticky removed": rules.set_sticky(None),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_every_write_compiles_with_exactly_the_names_and_values_it_uses(name: str) -> None:
    kwargs = compile_lease_write(WRITES[name])
    text = kwargs["ConditionExpression"] + " " + kwargs.get("UpdateExpression", "")
    assert set(kwargs["ExpressionAttributeNames"]) == set(re.findall(r"#\w+", text))
    assert set(kwargs.get("ExpressionAttributeValues", {})) == set(re.findall(r":\w+", text))
    # Every stored name comes from the codec.
    codec_names = {n for names in FIELD_ATTRIBUTES.values() for n in names}
    assert set(kwargs["ExpressionAttributeNames"].values()) <= codec_names


def test_updates_compile_to_set_remove_and_add() -> None:
    kwargs = compile_lease_write(rules.take(held(), "b"))
    assert kwargs["UpdateExpression"] == (
        "SET #leaseCounter = :v1, #leaseOwner = :v2 REMOVE #checkpointOwner"
        " ADD #ownerSwitchesSinceCheckpoint :v3"
    )
    assert kwargs["ExpressionAttributeValues"][":v3"] == {"N": "1"}
    pending = compile_lease_write(rules.checkpoint(held(), CP1, CP2))
    assert "REMOVE" not in pending["UpdateExpression"]
    assert pending["ExpressionAttributeValues"][":v4"] == {"N": "3"}  # the pending sub-sequence


def test_checkpoint_mode_is_chosen_by_the_rules() -> None:
    assert rules.checkpoint(held(), CP1).mode is rules.CheckpointMode.NORMAL
    assert rules.checkpoint(held(), CP1).increments_counter
    handoff = rules.checkpoint(held(owner="b", checkpoint_owner="a"), CP1)
    assert handoff.mode is rules.CheckpointMode.HANDOFF
    assert not handoff.increments_counter
    assert all(action.attr is not rules.Attr.COUNTER for action in handoff.update)


def test_empty_child_shard_ids_are_refused_before_any_write() -> None:
    with pytest.raises(ValueError, match="empty"):
        rules.update_child_shard_ids(held(), frozenset())


def test_lock_conditions_compile_to_the_lock_clients_expressions() -> None:
    kwargs = compile_write(rules.lock_release("v1", "a"), schema=LOCK_SCHEMA)
    assert kwargs["ConditionExpression"] == (
        "attribute_exists(#key) AND #recordVersionNumber = :v0 AND #ownerName = :v1"
    )
    assert kwargs["ExpressionAttributeValues"] == {":v0": {"S": "v1"}, ":v1": {"S": "a"}}
