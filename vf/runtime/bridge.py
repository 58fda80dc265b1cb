"""The model-endpoint bridge into a sandbox that has no network.

A program in the bubblewrap sandbox reaches the interception server through a Unix socket bound
read-only into the sandbox: this stdlib-only script (run by the sandbox's own `python3`, passed
with `-c` so nothing on the host needs to be readable by the sandbox user) listens on the
sandbox's private loopback and relays each connection to the socket, then runs the command as its
child and exits with the child's status. The sandbox keeps its own network namespace: nothing
but the interception server is reachable.

When the server answers before it has read the whole request (a body over its `max_body_mb`
gets 413 and the server stops reading), the relay reads and drops the rest of what the client
sends (at most 1 GiB, 30 s without a byte), so the client, which sends its whole body before it
reads, gets to read the 413 instead of blocking on a send until its own timeout.
"""

SOCKET_DIR = "/run/vf-model"
"""Where the host's socket directory appears inside the sandbox."""
PORT = 47821
"""The sandbox-loopback port programs call (each sandbox has its own loopback)."""

SCRIPT = r'''
import signal, socket, subprocess, sys, threading
path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
DRAIN_SECONDS, DRAIN_BYTES = 30, 1 << 30
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(128)

def relay(src, dst, drain=False):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        if drain:  # the server answered early (a 413) and stopped reading: let the client finish
            discard(src)  # sending, or it never reads that answer
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def discard(src):
    src.settimeout(DRAIN_SECONDS)
    left = DRAIN_BYTES
    try:
        while left > 0:
            data = src.recv(65536)
            if not data:
                break
            left -= len(data)
    except OSError:
        pass

def accept():
    while True:
        conn, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=relay, args=(conn, upstream, True), daemon=True).start()
        threading.Thread(target=relay, args=(upstream, conn), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
child = subprocess.Popen(argv)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda s, f: child.send_signal(s))
code = child.wait()
sys.exit(128 - code if code < 0 else code)
'''
