"""A raw TCPStore client of the keys dlrun's agents write (torch's own client prefixes "/" to
every key; the agents' keys have none): set, add and whether a key exists, nothing more."""

import socket
import struct

SET, ADD, CHECK = 0, 3, 4  # TCPStore 1.x's op codes (store/wire.h)


class PlainStore:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)

    @staticmethod
    def _bytes(text):
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError("the store closed the connection")
            data += chunk
        return data

    def set(self, key, value):
        self.sock.sendall(bytes([SET]) + self._bytes(key) + self._bytes(value))

    def add(self, key, delta):
        self.sock.sendall(bytes([ADD]) + self._bytes(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self._read(8))[0]

    def exists(self, key):
        self.sock.sendall(bytes([CHECK]) + struct.pack("<Q", 1) + self._bytes(key))
        return self._read(1) == b"\x00"

    def close(self):
        self.sock.close()
