"""A TCP proxy in front of a real server whose answers can be made to fault, for issue 53's tests.

What the client sends always reaches the server; what the server answers goes back as `mode` says:
"pass" as it comes, "silent" never (the connection stays open: a peer that accepted and never answers),
"trickle" one byte every `trickle_s`, "endless" replaced by a 200 whose body runs on for `endless_bytes`.
The mode is read at each piece of an answer, so switching it reaches connections already open.
"""

from __future__ import annotations

import socket
import threading
import time


class FaultProxy:
    def __init__(self, target_port: int, *, trickle_s: float = 0.5, endless_bytes: int = 48 << 20) -> None:
        self.target_port, self.trickle_s, self.endless_bytes = target_port, trickle_s, endless_bytes
        self.mode = "pass"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._forward, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._answer, args=(upstream, client), daemon=True).start()

    def _forward(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while piece := src.recv(65536):
                dst.sendall(piece)
        except OSError:
            pass
        finally:
            _close(dst)

    def _answer(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while piece := upstream.recv(65536):
                mode = self.mode
                if mode == "silent":
                    continue
                if mode == "trickle":
                    for i in range(len(piece)):
                        if self._stop.wait(self.trickle_s):
                            return
                        client.sendall(piece[i : i + 1])
                    continue
                if mode == "endless":
                    client.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[")
                    sent, chunk = 0, b" " * 65536
                    while sent < self.endless_bytes and not self._stop.is_set():
                        client.sendall(chunk)
                        sent += len(chunk)
                    return
                client.sendall(piece)
        except OSError:
            pass
        finally:
            _close(client)

    def close(self) -> None:
        self._stop.set()
        _close(self._listener)
        for sock in self._sockets:
            _close(sock)
        time.sleep(0.05)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
