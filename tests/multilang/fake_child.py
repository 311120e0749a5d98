"""A scripted MultiLang child for the adapter tests (no client library): every line received is
appended to the file named by argv[1]; argv[2] picks the behaviour on ``processRecords``:
``talk`` (a non-message line, then three checkpoint requests, then the status), ``exit`` (exit
with status 3), ``wrong`` (a status for another action), ``silent`` (no answer), ``slow``
(answer after 1.5 s). Every other message is answered with its status."""

from __future__ import annotations

import json
import sys
import time

out, mode = sys.argv[1], sys.argv[2]


def send(message: dict[str, object]) -> None:
    sys.stdout.write("\n" + json.dumps(message) + "\n")
    sys.stdout.flush()


def receive() -> dict[str, object] | None:
    line = sys.stdin.readline()
    if not line:
        return None
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(line)
    return json.loads(line)


while True:
    message = receive()
    if message is None:
        break
    action = message["action"]
    if action == "initialize":
        sys.stderr.write("starting up\n")
        sys.stderr.flush()
        send({"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None})
        receive()
    if action == "processRecords":
        if mode == "exit":
            sys.exit(3)
        if mode == "wrong":
            send({"action": "status", "responseFor": "initialize"})
            continue
        if mode == "silent":
            time.sleep(60)
        if mode == "slow":
            time.sleep(1.5)
        if mode == "talk":
            sys.stdout.write("not a message\n")
            records = message["records"]
            assert isinstance(records, list)
            first = records[0]["sequenceNumber"]
            for seq, sub in (("abc", None), (first, 0), (None, None)):
                send({"action": "checkpoint", "sequenceNumber": seq, "subSequenceNumber": sub})
                receive()
    send({"action": "status", "responseFor": action})
