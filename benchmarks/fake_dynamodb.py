"""A DynamoDB stand-in for the scale benchmark: tables held in memory, answered with the
service's JSON wire format, in a process of its own so its CPU is not the worker's.

    python benchmarks/fake_dynamodb.py PORT

moto's server answers a conditional UpdateItem in ~6 ms of its one core: a worker holding 2,000
shards at 1 record/s checkpoints 2,000 times a second, so against moto the stand-in, not the
worker, would be measured. This one applies what kclasync sends (PutItem, GetItem, UpdateItem
with ``SET a = :v``, ``SET a = b + :v``, ``if_not_exists``, ``REMOVE`` and ``ADD``, DeleteItem,
Scan and the owner-index Query with paging, CreateTable, DescribeTable, the TTL calls) and
**accepts every condition**: it is for one worker alone, where no write can lose a race; the
protocol's conditions are tested on moto and dynalite, not here. Not for correctness tests.
"""

from __future__ import annotations

import re
import sys
import time
from decimal import Decimal
from typing import Any

import orjson
from aiohttp import web

Item = dict[str, dict[str, Any]]

_CLAUSE = re.compile(r"\b(SET|REMOVE|ADD|DELETE)\b")


class Table:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.hash_key = next(
            k["AttributeName"] for k in spec["KeySchema"] if k["KeyType"] == "HASH"
        )
        self.items: dict[str, Item] = {}

    def key(self, key: Item) -> str:
        return orjson.dumps(key[self.hash_key]).decode()


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _number(value: dict[str, Any]) -> Decimal:
    return Decimal(value["N"])


class Updater:
    def __init__(self, item: Item, names: dict[str, str], values: Item) -> None:
        self.item, self.names, self.values = item, names, values

    def name(self, token: str) -> str:
        return self.names.get(token.strip(), token.strip())

    def operand(self, token: str) -> dict[str, Any] | None:
        token = token.strip()
        if token.startswith(":"):
            return self.values[token]
        match = re.fullmatch(r"if_not_exists\((.+),(.+)\)", token)
        if match:
            current = self.item.get(self.name(match[1]))
            return current if current is not None else self.operand(match[2])
        return self.item.get(self.name(token))

    def value(self, expr: str) -> dict[str, Any] | None:
        depth, split = 0, None
        for i, ch in enumerate(expr):
            depth += ch == "("
            depth -= ch == ")"
            if ch in "+-" and depth == 0:
                split = i
        if split is None:
            return self.operand(expr)
        left, right = self.operand(expr[:split]), self.operand(expr[split + 1 :])
        a, b = _number(left or {"N": "0"}), _number(right or {"N": "0"})
        return {"N": str(a + b if expr[split] == "+" else a - b)}

    def apply(self, expression: str) -> None:
        pieces = _CLAUSE.split(expression)
        for i in range(1, len(pieces), 2):
            verb, body = pieces[i], pieces[i + 1]
            for part in _split_top(body):
                if verb == "SET":
                    target, _, expr = part.partition("=")
                    value = self.value(expr)
                    if value is not None:
                        self.item[self.name(target)] = value
                elif verb == "REMOVE":
                    self.item.pop(self.name(part), None)
                elif verb == "ADD":
                    target, value_token = part.split()
                    add = self.values[value_token]
                    current = self.item.get(self.name(target))
                    if "N" in add:
                        base = _number(current) if current else Decimal(0)
                        self.item[self.name(target)] = {"N": str(base + _number(add))}
                    else:  # a set
                        kind = next(iter(add))
                        merged = set(current[kind]) if current else set()
                        self.item[self.name(target)] = {kind: sorted(merged | set(add[kind]))}


def _error(kind: str, message: str) -> web.Response:
    body = orjson.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{kind}", "message": message})
    return web.Response(body=body, status=400, content_type="application/x-amz-json-1.0")


def _ok(payload: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/x-amz-json-1.0")


def make_app() -> web.Application:
    tables: dict[str, Table] = {}

    def describe(table: Table) -> dict[str, Any]:
        spec = dict(table.spec)
        spec.update(
            TableStatus="ACTIVE",
            ItemCount=len(table.items),
            CreationDateTime=time.time(),
            TableArn=f"arn:aws:dynamodb:us-east-1:123456789012:table/{spec['TableName']}",
        )
        for index in spec.get("GlobalSecondaryIndexes", []):
            index["IndexStatus"] = "ACTIVE"
        return spec

    def page(items: list[Item], table: Table, body: dict[str, Any]) -> dict[str, Any]:
        items.sort(key=lambda it: table.key({table.hash_key: it[table.hash_key]}))
        start = body.get("ExclusiveStartKey")
        if start is not None:
            mark = table.key(start)
            items = [it for it in items if table.key({table.hash_key: it[table.hash_key]}) > mark]
        limit = int(body.get("Limit", 1_000_000))
        out: dict[str, Any] = {"Items": items[:limit], "Count": len(items[:limit])}
        if len(items) > limit:
            out["LastEvaluatedKey"] = {table.hash_key: items[limit - 1][table.hash_key]}
        if body.get("Select") == "COUNT":
            out.pop("Items")
        return out

    async def handle(request: web.Request) -> web.Response:
        op = request.headers.get("X-Amz-Target", "").rpartition(".")[2]
        body = orjson.loads(await request.read() or b"{}")
        name = body.get("TableName", "")
        if op == "CreateTable":
            if name in tables:
                return _error("ResourceInUseException", f"table {name} exists")
            tables[name] = Table(body)
            return _ok({"TableDescription": describe(tables[name])})
        if op == "ListTables":
            return _ok({"TableNames": sorted(tables)})
        table = tables.get(name)
        if table is None:
            return _error("ResourceNotFoundException", f"Requested resource not found: {name}")
        if op == "DescribeTable":
            return _ok({"Table": describe(table)})
        if op in ("UpdateTimeToLive", "DescribeTimeToLive"):
            spec = body.get("TimeToLiveSpecification", {"Enabled": False})
            return _ok({"TimeToLiveSpecification": spec, "TimeToLiveDescription": {}})
        if op == "PutItem":
            item = body["Item"]
            table.items[table.key({table.hash_key: item[table.hash_key]})] = item
            return _ok({})
        if op == "GetItem":
            item = table.items.get(table.key(body["Key"]))
            return _ok({"Item": item} if item is not None else {})
        if op == "DeleteItem":
            table.items.pop(table.key(body["Key"]), None)
            return _ok({})
        if op == "UpdateItem":
            key = table.key(body["Key"])
            item = dict(table.items.get(key) or body["Key"])
            Updater(
                item,
                body.get("ExpressionAttributeNames", {}),
                body.get("ExpressionAttributeValues", {}),
            ).apply(body.get("UpdateExpression", ""))
            table.items[key] = item
            return _ok({"Attributes": item} if body.get("ReturnValues", "NONE") != "NONE" else {})
        if op == "Scan":
            return _ok(page(list(table.items.values()), table, body))
        if op == "Query":
            names = body.get("ExpressionAttributeNames", {})
            values = body.get("ExpressionAttributeValues", {})
            left, _, right = body["KeyConditionExpression"].partition("=")
            attr, wanted = names.get(left.strip(), left.strip()), values[right.strip()]
            found = [it for it in table.items.values() if it.get(attr) == wanted]
            return _ok(page(found, table, body))
        return _error("UnknownOperationException", f"{op} is not served here")

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/", handle)
    return app


def main() -> None:
    web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
