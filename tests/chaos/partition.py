"""A TCP relay that can go silent: a network partition between one worker and the database.

The worker connects to the database through the relay; ``cut()`` stops every byte in
both directions without closing anything (as a dropped link or a firewall's DROP does:
no RST, no FIN, the worker's queries simply hang), ``heal()`` lets the traffic through
again. Used in place of a network namespace and iptables, which need tools this machine
may not have; what the worker sees is the same.
"""

import select
import socket
import threading


class Relay:
    def __init__(self, target_host, target_port):
        self.target = (target_host, target_port)
        self.silent = threading.Event()
        self.closed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self):
        self.silent.set()

    def heal(self):
        self.silent.clear()

    def close(self):
        self.closed.set()
        self.server.close()

    def _accept(self):
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a, b):
        peers = {a: b, b: a}
        try:
            while not self.closed.is_set():
                if self.silent.is_set():
                    self.closed.wait(0.02)  # read nothing: the bytes wait in the kernel
                    continue
                ready, _, _ = select.select([a, b], [], [], 0.05)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()
