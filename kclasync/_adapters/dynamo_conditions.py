"""The core's lease-table write conditions as DynamoDB ConditionExpressions.

Owns: ``compile_condition`` (a ``_core.lease_rules`` condition tree to an expression with its
attribute names and values) and ``conditional`` (those merged with a write's own names and
values). Must not: choose a condition (``_core.lease_rules`` does) or do I/O.
"""

from __future__ import annotations

from typing import Any

from kclasync._adapters import lease_codec as c
from kclasync._core import lease_rules as rules

#: Expression placeholder and stored attribute name of each attribute a condition reads.
_CONDITION_NAMES = {
    rules.Attr.KEY: ("#k", c.LEASE_KEY),
    rules.Attr.COUNTER: ("#c", c.LEASE_COUNTER),
    rules.Attr.OWNER: ("#o", c.LEASE_OWNER),
    rules.Attr.CHECKPOINT_OWNER: ("#co", c.CHECKPOINT_OWNER),
}


def compile_condition(
    condition: rules.Condition,
) -> tuple[str, dict[str, str], dict[str, dict[str, str]]]:
    """A core write condition as (ConditionExpression, names, values).

    Attribute placeholders are fixed per attribute (``#c`` is always leaseCounter), so they
    merge with an UpdateExpression's; value placeholders are ``:if0``, ``:if1``, ...
    """
    names: dict[str, str] = {}
    values: dict[str, dict[str, str]] = {}

    def term(node: rules.Condition) -> str:
        if isinstance(node, rules.All):
            return " AND ".join(term(t) for t in node.terms)
        placeholder, name = _CONDITION_NAMES[node.attr]
        names[placeholder] = name
        if isinstance(node, rules.Exists):
            return f"attribute_exists({placeholder})"
        if isinstance(node, rules.Missing):
            return f"attribute_not_exists({placeholder})"
        value = f":if{len(values)}"
        if isinstance(node.value, int):
            values[value] = {"N": str(node.value)}
        else:
            values[value] = {"S": node.value}
        return f"{placeholder} = {value}"

    return term(condition), names, values


def conditional(
    condition: rules.Condition,
    names: dict[str, str] | None = None,
    values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """ConditionExpression and the merged names and values of a write's keyword arguments."""
    expression, cond_names, cond_values = compile_condition(condition)
    kwargs: dict[str, Any] = {
        "ConditionExpression": expression,
        "ExpressionAttributeNames": (names or {}) | cond_names,
    }
    merged = (values or {}) | cond_values
    if merged:
        kwargs["ExpressionAttributeValues"] = merged
    return kwargs


__all__ = ["compile_condition", "conditional"]
