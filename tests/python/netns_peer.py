"""Small programs for test_netns_fixture.py; most run inside a simulated host.

  netns_peer.py serve ADDRESS PORT READY_FILE
      Listens on ADDRESS:PORT, then writes its hostname to READY_FILE (atomically); answers
      every connection with "<hostname> got <what the client sent>". Runs until killed.
  netns_peer.py connect HOST PORT TIMEOUT_S
      Connects (timeout TIMEOUT_S), sends its hostname, prints "reply <answer>", or "timeout",
      "refused" or "error <what>".
  netns_peer.py hold N RECORD_FILE
      Runs in the root namespace as a test process would: makes a Hosts(N) set, starts a
      process in host N-1, writes {"prefix", "pid"} to RECORD_FILE (atomically), then waits for
      end of file on stdin (or a signal) and exits 0.

Importing netns_fixture installs its connect guard here too.
"""

import json
import os
import socket
import sys

import netns_fixture


def write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def serve(address, port, ready):
    server = socket.create_server((address, int(port)))
    name = socket.gethostname()
    write_atomically(ready, name)
    while True:
        connection, _ = server.accept()
        with connection:
            data = b""
            while chunk := connection.recv(100):
                data += chunk
            connection.sendall(name.encode() + b" got " + data)


def connect(host, port, timeout):
    try:
        with socket.create_connection((host, int(port)), timeout=float(timeout)) as s:
            s.sendall(socket.gethostname().encode())
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := s.recv(100):
                reply += chunk
        print("reply", reply.decode())
    except TimeoutError:
        print("timeout")
    except ConnectionRefusedError:
        print("refused")
    except OSError as error:
        print("error", error)


def hold(n, record):
    n = int(n)
    hosts = netns_fixture.Hosts(n)
    process = hosts.popen(n - 1, ["sleep", "1000"])
    write_atomically(record, json.dumps({"prefix": hosts.prefix, "pid": process.pid}))
    sys.stdin.read()
    hosts.close()


if __name__ == "__main__":
    commands = {"serve": serve, "connect": connect, "hold": hold}
    commands[sys.argv[1]](*sys.argv[2:])
