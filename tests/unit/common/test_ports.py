"""A port's bindability is asked the way the servers bind it: a port that a killed server left
with connections in TIME_WAIT is free, one that something listens on is not."""

import socket
import time

from rlrun.common.ports import listen_socket, why_unbindable


def _port_in_time_wait() -> int:
    """A loopback port whose listener is closed and whose one accepted connection was closed
    by the server side first, as the kernel closes them for a process killed by SIGKILL: that
    side's socket stays in TIME_WAIT."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()
    listener.close()
    client.recv(1)  # the server's FIN has arrived
    client.close()
    time.sleep(0.1)
    return port


def test_a_port_left_in_time_wait_is_free_for_a_restarted_server():
    port = _port_in_time_wait()
    with socket.socket() as plain:  # the premise: a bind without SO_REUSEADDR is refused
        try:
            plain.bind(("127.0.0.1", port))
        except OSError:
            pass
        else:
            raise AssertionError("no TIME_WAIT socket was left on the port")
    assert why_unbindable("127.0.0.1", port) is None
    listen_socket("127.0.0.1", port, "the test server", "--port").close()


def test_a_port_something_listens_on_is_in_use():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert why_unbindable("127.0.0.1", port) == "address already in use"
