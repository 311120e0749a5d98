"""The core's write rules as DynamoDB expressions.

Owns: compiling a ``_core.lease_rules`` write (its condition tree and its update actions) into
the keyword arguments of a DynamoDB write: ``ConditionExpression``, ``UpdateExpression``
(``SET`` / ``REMOVE`` / ``ADD`` clauses) and the attribute names and values both use
(``compile_write``), for any table whose ``Schema`` says how it stores the rules' attributes:
the lease table's (``LEASE_SCHEMA``, from ``lease_codec``) and the leader lock's (in
``coordinator_state``).
Must not: choose a condition or an update (``_core.lease_rules`` does), know an attribute name
(the schemas do), or do I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kclasync._adapters import lease_codec as c
from kclasync._core.leases import lease_rules as rules

Typed = dict[str, Any]


@attrs.frozen
class Schema:
    """How a table stores the attributes its rules name: ``names`` gives the stored attribute
    names of a rules attribute (a condition reads the first), ``encode`` the stored attributes
    (name -> typed value) of a value."""

    names: Callable[[Any], tuple[str, ...]]
    encode: Callable[[Any, Any], dict[str, Typed]]


def _lease_names(attr: rules.Attr) -> tuple[str, ...]:
    return c.FIELD_ATTRIBUTES[attr.value]


def _lease_encode(attr: rules.Attr, value: Any) -> dict[str, Typed]:
    return c.field_item(attr.value, value)


#: The lease table: ``Attr`` is a ``Lease`` field, stored as ``lease_codec`` says.
LEASE_SCHEMA = Schema(_lease_names, _lease_encode)


class _Expressions:
    """Placeholders of one request: ``#<stored name>`` for names, ``:v0``, ``:v1``, ... for
    values, shared by its condition and its update (DynamoDB rejects unused ones, so only what
    an expression uses is registered)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.names: dict[str, str] = {}
        self.values: dict[str, Typed] = {}

    def name(self, stored: str) -> str:
        placeholder = f"#{stored}"
        self.names[placeholder] = stored
        return placeholder

    def value(self, typed: Typed) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = typed
        return placeholder

    def one(self, attr: Any, value: Any) -> tuple[str, str]:
        """The name and value placeholders of a single-attribute value."""
        ((stored, typed),) = self.schema.encode(attr, value).items()
        return self.name(stored), self.value(typed)

    def condition(self, node: rules.Condition) -> str:
        if isinstance(node, rules.All):
            return " AND ".join(self.condition(t) for t in node.terms)
        if isinstance(node, rules.Equals):
            name, value = self.one(node.attr, node.value)
            return f"{name} = {value}"
        name = self.name(self.schema.names(node.attr)[0])
        if isinstance(node, rules.Exists):
            return f"attribute_exists({name})"
        return f"attribute_not_exists({name})"

    def update(self, actions: tuple[rules.Action, ...]) -> str:
        sets: list[str] = []
        removes: list[str] = []
        adds: list[str] = []
        for action in actions:
            if isinstance(action, rules.Set):
                for stored, typed in self.schema.encode(action.attr, action.value).items():
                    sets.append(f"{self.name(stored)} = {self.value(typed)}")
            elif isinstance(action, rules.Remove):
                removes.extend(self.name(stored) for stored in self.schema.names(action.attr))
            else:
                name, value = self.one(action.attr, action.amount)
                adds.append(f"{name} {value}")
        clauses = [
            f"{keyword} {', '.join(parts)}"
            for keyword, parts in (("SET", sets), ("REMOVE", removes), ("ADD", adds))
            if parts
        ]
        return " ".join(clauses)


def compile_condition(
    condition: rules.Condition, schema: Schema = LEASE_SCHEMA
) -> tuple[str, dict[str, str], dict[str, Typed]]:
    """A condition alone as (ConditionExpression, names, values)."""
    expressions = _Expressions(schema)
    text = expressions.condition(condition)
    return text, expressions.names, expressions.values


def compile_write(
    condition: rules.Condition,
    update: tuple[rules.Action, ...] = (),
    schema: Schema = LEASE_SCHEMA,
) -> dict[str, Any]:
    """The keyword arguments of a conditional write: ConditionExpression, UpdateExpression (when
    there is an update), and the names and values they use."""
    expressions = _Expressions(schema)
    kwargs: dict[str, Any] = {"ConditionExpression": expressions.condition(condition)}
    if update:
        kwargs["UpdateExpression"] = expressions.update(update)
    kwargs["ExpressionAttributeNames"] = expressions.names
    if expressions.values:
        kwargs["ExpressionAttributeValues"] = expressions.values
    return kwargs


def compile_lease_write(write: rules.Write) -> dict[str, Any]:
    """A lease-table write's keyword arguments."""
    return compile_write(write.condition, write.update)


__all__ = [
    "LEASE_SCHEMA",
    "Schema",
    "compile_condition",
    "compile_lease_write",
    "compile_write",
]
