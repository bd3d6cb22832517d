#!/usr/bin/env python3
"""A client of rpc-serve in another process, written from docs/PROTOCOL.md alone.

It starts rpc-serve (v1 mailbox, 4 ports, one lane), maps the mailbox from the `ready PATH
BYTES` line, and speaks the protocol as a one-lane GPU warp would: TEST_INCREMENT, a
WRITE_TO_STDOUT_NEWLINE of a line, and TEST_STREAM of 200 bytes (four packets each way).

    python3 examples/rpc_serve_client.py [PATH-TO-rpc-serve]

Ordering: PROTOCOL section 3 asks for a release fence before a flip and an acquire fence after
seeing one. Python has no fences; this example relies on x86-64's ordering (stores are seen in
program order, loads are not reordered with older loads) and on CPython doing each mmap access
as one plain copy. On another architecture write the client in C or Rust.
"""

import mmap
import os
import struct
import subprocess
import sys
import time

PORTS, LANES = 4, 1
# PROTOCOL section 2, v1 (D = 0): primary, secondary, header, packet.
PRIMARY, SECONDARY, HEADER = 0, 4 * PORTS, 8 * PORTS
PACKET = 24 * PORTS  # align_up(24 N, 8)
TEST_INCREMENT, TEST_STREAM = 0x63008000, 0x63008002
WRITE_TO_STDOUT_NEWLINE = 0x63000005


class Port:
    """One port of the mailbox, used by this one-lane client (no other client shares it)."""

    def __init__(self, memory, index, opcode):
        self.memory, self.index = memory, index
        self.owns, self.receive = True, False
        self.wait_owned()
        # The header is published by the first send's flip.
        struct.pack_into("<QI", memory, HEADER + 16 * index, 1, opcode)

    def word(self, base):
        return struct.unpack_from("<I", self.memory, base + 4 * self.index)[0] != 0

    def wait_owned(self, seconds=30):
        """The client owns the buffer when its word equals the server's."""
        deadline = time.monotonic() + seconds
        while self.word(SECONDARY) != self.word(PRIMARY):
            if time.monotonic() > deadline:
                raise TimeoutError(f"port {self.index}: no answer from rpc-serve")
            time.sleep(0)

    def flip(self):
        mine = SECONDARY + 4 * self.index
        struct.pack_into("<I", self.memory, mine, 0 if self.word(SECONDARY) else 1)

    def buffer(self):
        return PACKET + 64 * LANES * self.index

    def send(self, data):
        self.wait_owned()
        self.memory[self.buffer():self.buffer() + len(data)] = data
        self.flip()
        self.owns, self.receive = False, False

    def recv(self):
        if self.receive:  # two receives in a row: hand the buffer back empty first
            self.flip()
        self.wait_owned()
        self.owns, self.receive = True, True
        return bytes(self.memory[self.buffer():self.buffer() + 64])

    def send_n(self, data):
        """PROTOCOL section 5: the length and 56 bytes, then 64 bytes a packet."""
        self.send(struct.pack("<Q", len(data)) + data[:56])
        for at in range(56, len(data), 64):
            self.send(data[at:at + 64])

    def recv_n(self):
        first = self.recv()
        (length,) = struct.unpack_from("<Q", first)
        data = first[8:8 + min(length, 56)]
        while len(data) < length:
            data += self.recv()[:min(64, length - len(data))]
        return data


def main():
    serve = sys.argv[1] if len(sys.argv) > 1 else "target/debug/rpc-serve"
    server = subprocess.Popen(
        [serve, "--gen", "v1", "--ports", str(PORTS), "--lanes", str(LANES)],
        stdout=subprocess.PIPE, text=True)
    try:
        ready = server.stdout.readline().split()
        assert ready and ready[0] == "ready", f"rpc-serve said {ready!r}"
        path, size = ready[1], int(ready[2])
        assert size == PACKET + 64 * LANES * PORTS, f"unexpected mailbox size {size}"
        fd = os.open(path, os.O_RDWR)
        memory = mmap.mmap(fd, size)
        os.close(fd)

        port = Port(memory, 0, TEST_INCREMENT)
        port.send(struct.pack("<Q", 41))
        (answer,) = struct.unpack_from("<Q", port.recv())
        assert answer == 42, answer
        print(f"TEST_INCREMENT 41 -> {answer}")

        port = Port(memory, 1, WRITE_TO_STDOUT_NEWLINE)
        line = b"a line from Python"
        port.send_n(line)
        (written,) = struct.unpack_from("<Q", port.recv())
        assert written == len(line) + 1, written
        print(f"WRITE_TO_STDOUT_NEWLINE wrote {written} bytes")

        port = Port(memory, 2, TEST_STREAM)
        data = bytes(range(200))
        port.send_n(data)
        back = port.recv_n()
        assert back == data, back
        print(f"TEST_STREAM {len(data)} bytes came back whole")
        memory.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    print("python client: ok")


if __name__ == "__main__":
    main()
