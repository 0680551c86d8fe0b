"""The host end of the executor's pipe: length-prefixed JSON over docker's attach socket.

Without a TTY docker multiplexes the container's stdout and stderr on the attach socket:
each frame is an 8-byte header (stream type: 1 stdout, 2 stderr; 3 bytes zero; 4-byte
big-endian size) and its payload. Requests go the other way raw, to the container's stdin.
The executor writes its replies on stdout; stderr (a Python traceback if it crashes) is kept
for the error message.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

STDOUT, STDERR = 1, 2


class ChannelError(Exception):
    """The executor is gone or did not answer in time: the sandbox is broken."""


class Demux:
    """Reassemble docker's multiplexed frames into a stdout byte stream (and stderr tail)."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.stdout = bytearray()
        self.stderr_tail = bytearray()

    def feed(self, data: bytes) -> None:
        self.raw += data
        while len(self.raw) >= 8:
            kind = self.raw[0]
            (size,) = struct.unpack(">I", self.raw[4:8])
            if len(self.raw) < 8 + size:
                break
            payload = bytes(self.raw[8 : 8 + size])
            del self.raw[: 8 + size]
            if kind == STDERR:
                self.stderr_tail = (self.stderr_tail + payload)[-4096:]
            else:
                self.stdout += payload

    def message(self) -> dict[str, Any] | None:
        """The next complete reply in the stdout stream, or None until it has all arrived."""
        if len(self.stdout) < 4:
            return None
        (size,) = struct.unpack(">I", self.stdout[:4])
        if len(self.stdout) < 4 + size:
            return None
        body = bytes(self.stdout[4 : 4 + size])
        del self.stdout[: 4 + size]
        return json.loads(body)


def encode(request: dict[str, Any]) -> bytes:
    data = json.dumps(request).encode()
    return struct.pack(">I", len(data)) + data


class Channel:
    """Send one request, wait for its reply, with a deadline. One caller at a time."""

    def __init__(self, sock: Any):
        # docker-py hands back a SocketIO wrapper on unix/tcp engines; talk to the socket.
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.wrapper = sock
        self.demux = Demux()
        self.next_id = 0

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send `request`, return its reply; ChannelError on EOF, socket error or deadline."""
        self.next_id += 1
        request = {**request, "id": self.next_id}
        deadline = time.monotonic() + timeout
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(encode(request))
            while True:
                reply = self.demux.message()
                if reply is not None:
                    if reply.get("id") == self.next_id:
                        return reply
                    continue  # a late reply to an abandoned request: skip it
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelError(f"the executor did not answer within {timeout:.1f}s")
                self.sock.settimeout(remaining)
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ChannelError("the executor exited (its stream closed)" + self._stderr())
                self.demux.feed(data)
        except TimeoutError:  # socket.timeout is TimeoutError since 3.10
            raise ChannelError(f"the executor did not answer within {timeout:.1f}s") from None
        except OSError as e:
            raise ChannelError(f"the executor's socket failed: {e}" + self._stderr()) from None

    def _stderr(self) -> str:
        text = self.demux.stderr_tail.decode("utf-8", "replace").strip()
        return f"; its last stderr: {text[-500:]}" if text else ""

    def close(self) -> None:
        for obj in (self.wrapper, self.sock):
            try:
                obj.close()
            except Exception:
                pass
