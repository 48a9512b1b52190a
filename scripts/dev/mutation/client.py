"""cosmic-ray's test command: ask the fork server (forkserver.py) to run pytest; exit with its status.

Usage: python client.py SOCKET PYTEST_ARGS...   (no heavy imports: starts in milliseconds)
"""
import json
import socket
import sys


def main() -> int:
    path, args = sys.argv[1], sys.argv[2:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall((json.dumps(args) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(64)
        if not chunk:
            return 2  # the server died: count as not survived, and it shows in the log
        data += chunk
    return int(data)


if __name__ == "__main__":
    sys.exit(main())
