"""HTTP/1.1 framing for the direct request path's own transport: the request bytes, and a
response reader fed with whatever the socket gives.

The reader accepts what a server may send to a POST: a status line of HTTP/1.1 or HTTP/1.0,
interim 1xx answers (skipped), a body framed by ``Content-Length``, by chunked transfer coding
(chunk extensions and trailers are read and dropped), or by the end of the connection. Header
names are lower-cased and values decoded as UTF-8, the way aiobotocore's session hands them to
botocore's parser (a repeated header keeps its last value, as there). Anything else (another
transfer coding, conflicting lengths, a malformed line, a head over ``MAX_HEAD`` bytes, a
truncated body) raises ``FramingError``; the caller then leaves the call to botocore.

Owns: ``request_bytes``, ``ResponseReader``, ``FramingError``.
Must not: touch a socket, read the clock, or interpret what the body means.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Longest response head (status line and headers) accepted.
MAX_HEAD = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")


class FramingError(ValueError):
    """The bytes received are not an HTTP/1.x response this reader accepts."""


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _checked(text: str) -> str:
    if "\r" in text or "\n" in text:
        raise FramingError(f"line break in a header: {text!r}")
    return text


def request_bytes(
    method: str, path: str, host: str, headers: Mapping[str, str], body: bytes
) -> bytes:
    """One request with ``body``: ``Host`` first, then ``headers``, the ``Accept`` and
    ``Accept-Encoding: identity`` headers aiobotocore's session sends, and the body's length."""
    lines = [f"{method} {_checked(path)} HTTP/1.1", f"Host: {_checked(host)}"]
    lines.extend(f"{_checked(name)}: {_checked(value)}" for name, value in headers.items())
    lines.append("Accept: */*")
    lines.append("Accept-Encoding: identity")
    lines.append(f"Content-Length: {len(body)}\r\n\r\n")
    return "\r\n".join(lines).encode("utf-8") + body


# Reader states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE, _DONE = range(7)


class ResponseReader:
    """One response, fed in pieces; ``feed`` and ``feed_eof`` say when it is complete."""

    __slots__ = ("_buf", "_chunks", "_need", "_state", "body", "headers", "keep_alive", "status")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = _HEAD
        self._need = 0
        self._chunks: list[bytes] = []
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        #: Whether the connection may carry another request after this response.
        self.keep_alive = False

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bool:
        """Add ``data``; True once the response is complete (bytes after it: ``FramingError``)."""
        if self._state == _DONE:
            raise FramingError("bytes after the response")
        self._buf += data
        self._advance()
        if self._state == _DONE and self._buf:
            raise FramingError("bytes after the response")
        return self._state == _DONE

    def feed_eof(self) -> bool:
        """The server closed: True when that ends the response, else ``FramingError``."""
        if self._state == _UNTIL_CLOSE:
            self.body = bytes(self._buf)
            self._buf.clear()
            self._state = _DONE
        if self._state != _DONE:
            raise FramingError("connection closed before the response ended")
        self.keep_alive = False
        return True

    def _advance(self) -> None:
        while True:
            state = self._state
            if state == _HEAD:
                if not self._head():
                    return
            elif state == _LENGTH:
                if len(self._buf) < self._need:
                    return
                self.body = bytes(self._buf[: self._need])
                del self._buf[: self._need]
                self._state = _DONE
            elif state == _CHUNK_SIZE:
                if not self._chunk_size():
                    return
            elif state == _CHUNK_DATA:
                need = self._need
                if len(self._buf) < need + 2:
                    return
                if self._buf[need : need + 2] != b"\r\n":
                    raise FramingError("chunk not followed by CRLF")
                self._chunks.append(bytes(self._buf[:need]))
                del self._buf[: need + 2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    self._limit()
                    return
                del self._buf[: end + 2]
                if end == 0:
                    self.body = b"".join(self._chunks)
                    self._state = _DONE
            else:  # _UNTIL_CLOSE, _DONE
                return

    def _limit(self) -> None:
        if len(self._buf) > MAX_HEAD:
            raise FramingError("header or chunk line too long")

    def _chunk_size(self) -> bool:
        end = self._buf.find(b"\r\n")
        if end < 0:
            self._limit()
            return False
        size = bytes(self._buf[:end]).split(b";", 1)[0].strip()
        if not size or not _HEX.issuperset(size):
            raise FramingError(f"bad chunk size {size!r}")
        del self._buf[: end + 2]
        self._need = int(size, 16)
        self._state = _CHUNK_DATA if self._need else _TRAILER
        return True

    def _head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            self._limit()
            return False
        try:
            lines = self._buf[:end].decode("utf-8").split("\r\n")
        except UnicodeDecodeError as exc:
            raise FramingError("response head is not UTF-8") from exc
        del self._buf[: end + 4]
        version, _, rest = lines[0].partition(" ")
        if (
            version not in ("HTTP/1.1", "HTTP/1.0")
            or not _digits(rest[:3])
            or rest[3:4] not in ("", " ")
        ):
            raise FramingError(f"bad status line {lines[0]!r}")
        status = int(rest[:3])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[-1] in " \t" or line[0] in " \t":
                raise FramingError(f"bad header line {line!r}")
            name, value = name.lower(), value.strip(" \t")
            if name == "content-length" and headers.get(name, value) != value:
                raise FramingError("conflicting Content-Length headers")
            headers[name] = value
        if 100 <= status < 200:
            if status == 101:
                raise FramingError("protocol switch")
            return True  # an interim answer: the final one follows
        self.status, self.headers = status, headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
        coding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                raise FramingError(f"transfer coding {coding!r}")
            self.keep_alive = self.keep_alive and length is None
            self._state = _CHUNK_SIZE
        elif status in (204, 304):
            self._state = _DONE
        elif length is not None:
            values = {v.strip() for v in length.split(",")}
            if len(values) != 1 or not _digits(value := values.pop()):
                raise FramingError(f"bad Content-Length {length!r}")
            self._need = int(value)
            self._state = _LENGTH
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE
        return True
