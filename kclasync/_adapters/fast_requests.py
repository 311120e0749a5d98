"""Less work per AWS call on the clients kclasync creates.

A worker's steady load is many small calls: a GetRecords per shard per idle pause and a
renewal per lease per renewer period. botocore spends a good part of each call on work whose
result does not change between calls: it validates every request's parameters against the
service model (kclasync's adapters build them from typed values), and it rebuilds the
User-Agent header from all its parts on every request. On a client made here, validation is
off (``parameter_validation=False`` in the client's config) and the User-Agent header is built
once per set of feature ids and reused: the header sent is the same string botocore would
build.

Owns: ``client_config`` (the config keys) and ``install`` (on one client, after it is made).
Must not: touch a session (the client's event emitter is its own copy), or change what is sent.
"""

from __future__ import annotations

from typing import Any

from botocore.context import get_context

#: Client config keys of the fast request path.
CLIENT_CONFIG: dict[str, Any] = {"parameter_validation": False}


def install(client: Any) -> None:
    """Replace ``client``'s per-request User-Agent rebuild by a cached one (same header)."""
    creator = getattr(client, "_user_agent_creator", None)
    if creator is None or not hasattr(creator, "rebuild_and_replace_user_agent_handler"):
        return  # another botocore: leave it as it is
    event = f"request-created.{client.meta.service_model.service_id.hyphenize()}"
    client.meta.events.unregister(event, creator.rebuild_and_replace_user_agent_handler)
    built: dict[frozenset[str], str] = {}

    def user_agent(request: Any, **kwargs: Any) -> None:
        ctx = get_context()
        key = frozenset(ctx.features) if ctx is not None else frozenset()
        value = built.get(key)
        if value is None:
            value = built[key] = creator.to_string()
        if request.headers.get("User-Agent"):
            request.headers.replace_header("User-Agent", value)

    client.meta.events.register_last(event, user_agent)
