"""The test server's event-stream encoding, checked byte by byte and against botocore's decoder."""

from __future__ import annotations

import binascii
import struct

import orjson
import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from kclasync.testing.eventstream import (
    INITIAL_RESPONSE,
    encode_message,
    event_message,
    exception_message,
)


def test_prelude_headers_payload_and_crcs() -> None:
    payload = b'{"a":1}'
    msg = encode_message({":event-type": "X", ":message-type": "event"}, payload)
    total, headers_len, prelude_crc = struct.unpack("!III", msg[:12])
    assert total == len(msg)
    assert prelude_crc == binascii.crc32(msg[:8])
    headers = msg[12 : 12 + headers_len]
    # name length, name, type 7 (string), value length, value
    assert headers[:1] == bytes([len(":event-type")])
    assert headers[1:12] == b":event-type"
    assert headers[12] == 7
    assert struct.unpack("!H", headers[13:15]) == (1,)
    assert headers[15:16] == b"X"
    assert msg[12 + headers_len : -4] == payload
    assert struct.unpack("!I", msg[-4:]) == (binascii.crc32(msg[:-4]),)


def test_botocore_decodes_what_the_server_encodes() -> None:
    event = {"Records": [], "ContinuationSequenceNumber": "123", "MillisBehindLatest": 0}
    stream = INITIAL_RESPONSE + event_message("SubscribeToShardEvent", event)
    stream += exception_message("ResourceInUseException", "busy")
    buf = EventStreamBuffer()
    # Fed in awkward pieces, as a network delivers them.
    for i in range(0, len(stream), 7):
        buf.add_data(stream[i : i + 7])
    messages = list(buf)
    assert [m.headers.get(":event-type") for m in messages] == [
        "initial-response",
        "SubscribeToShardEvent",
        None,
    ]
    assert messages[0].payload == b"{}"
    assert orjson.loads(messages[1].payload) == event
    assert messages[2].headers[":message-type"] == "exception"
    assert messages[2].headers[":exception-type"] == "ResourceInUseException"
    assert messages[1].to_response_dict()["status_code"] == 200
    assert messages[2].to_response_dict()["status_code"] == 400


def test_a_damaged_frame_is_rejected_by_the_decoder() -> None:
    msg = bytearray(event_message("SubscribeToShardEvent", {"Records": []}))
    msg[-6] ^= 0xFF  # a payload byte
    buf = EventStreamBuffer()
    buf.add_data(bytes(msg))
    with pytest.raises(ChecksumMismatch):
        list(buf)
