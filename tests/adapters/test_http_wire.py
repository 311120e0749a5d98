"""The direct transport's HTTP/1.1 framing: every way a server may frame a response to a POST is
read into the same status, headers and body, in any split of the bytes; what it does not accept
is refused with ``FramingError`` (the call then goes through botocore)."""

from __future__ import annotations

import pytest

from kclasync._adapters.http_wire import FramingError, ResponseReader, request_bytes

BODY = b'{"Records": [], "NextShardIterator": "AAAA"}'


def _read(raw: bytes, *, step: int | None = None, eof: bool = False) -> ResponseReader:
    reader = ResponseReader()
    pieces = [raw] if step is None else [raw[i : i + step] for i in range(0, len(raw), step)]
    done = False
    for piece in pieces:
        assert not done, "complete before its last byte"
        done = reader.feed(piece)
    if eof:
        assert not done
        done = reader.feed_eof()
    assert done and reader.complete
    return reader


def _length(body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 200 OK\r\nX-Amzn-RequestId: r1\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def _chunked(body: bytes, sizes: tuple[int, ...], trailer: bytes = b"") -> bytes:
    out = b"HTTP/1.1 200 OK\r\nx-amzn-requestid: r1\r\nTransfer-Encoding: chunked\r\n\r\n"
    start = 0
    for size in sizes:
        out += f"{size:X};ext=1\r\n".encode() + body[start : start + size] + b"\r\n"
        start += size
    assert start == len(body)
    return out + b"0\r\n" + trailer + b"\r\n"


@pytest.mark.parametrize("step", [None, 1, 7])
@pytest.mark.parametrize(
    ("raw", "eof", "keep_alive"),
    [
        (_length(BODY), False, True),
        (_length(BODY, "Connection: close\r\n"), False, False),
        (_chunked(BODY, (5, 30, len(BODY) - 35)), False, True),
        (_chunked(BODY, (len(BODY),), b"x-amz-crc32: 1\r\n"), False, True),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + _length(BODY), False, True),
        (b"HTTP/1.0 200 OK\r\nx-amzn-requestid: r1\r\n\r\n" + BODY, True, False),
        (_length(BODY).replace(b"HTTP/1.1", b"HTTP/1.0", 1), False, False),
        (
            _length(BODY, "Connection: Keep-Alive\r\n").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
            False,
            True,
        ),
    ],
)
def test_every_framing_gives_the_same_response(
    raw: bytes, eof: bool, keep_alive: bool, step: int | None
) -> None:
    reader = _read(raw, step=step, eof=eof)
    assert (reader.status, reader.body) == (200, BODY)
    assert reader.headers["x-amzn-requestid"] == "r1"  # names lower-cased, as aiobotocore's
    assert reader.keep_alive is (keep_alive and not eof)


def test_no_body_statuses_and_repeated_headers() -> None:
    reader = _read(b"HTTP/1.1 204 No Content\r\nA: 1\r\na: 2\r\n\r\n")
    assert (reader.status, reader.body, reader.headers) == (204, b"", {"a": "2"})
    error = _read(_length(b'{"__type": "x"}').replace(b"200 OK", b"400 Bad Request"))
    assert error.status == 400 and error.body == b'{"__type": "x"}'


@pytest.mark.parametrize(
    ("raw", "eof"),
    [
        (_length(BODY)[:-3], True),  # the body cut short
        (_chunked(BODY, (len(BODY),))[:-5], True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n", False),
        (b"HTTP/2 200\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nName : x\r\n\r\n", False),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", False),
        (_length(b"ab") + b"HTTP/1.1 200 OK\r\n", False),  # bytes after the response
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000, False),
    ],
)
def test_what_is_not_accepted_is_a_framing_error(raw: bytes, eof: bool) -> None:
    reader = ResponseReader()
    with pytest.raises(FramingError):
        reader.feed(raw)
        if eof:
            reader.feed_eof()


def test_request_bytes() -> None:
    raw = request_bytes("POST", "/", "dynamodb.us-east-1.amazonaws.com", {"X-A": "1"}, b"{}")
    assert raw == (
        b"POST / HTTP/1.1\r\nHost: dynamodb.us-east-1.amazonaws.com\r\nX-A: 1\r\n"
        b"Accept: */*\r\nAccept-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}"
    )
    with pytest.raises(FramingError):
        request_bytes("POST", "/", "h", {"X-A": "1\r\nX-B: 2"}, b"")
