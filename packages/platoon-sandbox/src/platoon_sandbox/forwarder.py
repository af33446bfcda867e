"""The route forwarder, run *inside* a sandbox by whatever Python it has (3.6 or newer).

Standard library only, and never imported by platoon: it is uploaded to `/tmp/platoon-route/forwarder.py` and run as
`python3 forwarder.py SOCKET_DIR SOCKET_NAME PORT_FILE PORT`. It listens on 127.0.0.1:PORT (0: a free port), writes
the port to PORT_FILE atomically once listening, and relays each connection to the Unix socket, connecting by name
from inside its directory so that a long path never hits the AF_UNIX path limit.
"""

import os
import signal
import socket
import sys
import threading


def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(client, name):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(name)  # relative: the socket may appear (or be replaced) after the forwarder started
    except OSError as exc:
        sys.stderr.write("cannot reach " + name + ": " + str(exc) + "\n")
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main():
    socket_dir, name, port_file, port = sys.argv[1:5]
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlives the shell or terminal that started it
    os.chdir(socket_dir)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(port)))
    server.listen(128)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(str(server.getsockname()[1]))
    os.replace(tmp, port_file)
    while True:
        client, _ = server.accept()
        threading.Thread(target=serve, args=(client, name), daemon=True).start()


if __name__ == "__main__":
    main()
