"""Less work per AWS call on the clients kclasync creates.

A worker's steady load is many small calls: a GetRecords per shard per idle pause and a
renewal per lease per renewer period. botocore spends a good part of each call on work whose
result does not change between calls: it validates every request's parameters against the
service model (kclasync's adapters build them from typed values), and it builds the
User-Agent header from all its parts twice on every request (when the request is made, and
again once it exists). On a client made here, validation is off (``parameter_validation=False``
in the client's config) and the User-Agent header is built once per set of feature ids and
reused: the header sent is the same string botocore would build.

Owns: ``client_config`` (the config keys) and ``install`` (on one client, after it is made).
Must not: touch a session (the client's event emitter is its own copy), or change what is sent.
"""

from __future__ import annotations

from typing import Any

from botocore.context import get_context

#: Client config keys of the fast request path.
CLIENT_CONFIG: dict[str, Any] = {"parameter_validation": False}


def install(client: Any) -> None:
    """Build ``client``'s User-Agent header once per set of feature ids (the same header):
    both where the request is first made (the client's own User-Agent creator, a copy of the
    session's made for this client) and where botocore rebuilds it once the request exists."""
    creator = getattr(client, "_user_agent_creator", None)
    if creator is None or not hasattr(creator, "rebuild_and_replace_user_agent_handler"):
        return  # another botocore: leave it as it is
    event = f"request-created.{client.meta.service_model.service_id.hyphenize()}"
    client.meta.events.unregister(event, creator.rebuild_and_replace_user_agent_handler)
    build = creator.to_string
    built: dict[frozenset[str], str] = {}

    def to_string() -> str:
        ctx = get_context()
        key = frozenset(ctx.features) if ctx is not None else frozenset()
        value = built.get(key)
        if value is None:
            value = built[key] = build()
        return value

    def user_agent(request: Any, **kwargs: Any) -> None:
        if request.headers.get("User-Agent"):
            request.headers.replace_header("User-Agent", to_string())

    creator.to_string = to_string
    client.meta.events.register_last(event, user_agent)
