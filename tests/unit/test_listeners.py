"""Where a process really listens, read from /proc/net/tcp{,6} (tasks/steps/host/probe.py): the
address fields as the kernel writes them, and this test process's own listening sockets."""
import os
import socket

from tasks.steps.host.probe import _address, tree_listeners


def test_the_kernels_address_fields_read_as_addresses():
    assert _address("0100007F") == "127.0.0.1"
    assert _address("00000000") == "0.0.0.0"
    assert _address("00000000000000000000000000000000") == "::"
    assert _address("00000000000000000000000001000000") == "::1"
    assert _address("0000000000000000FFFF00000100007F") == "127.0.0.1"  # v4-mapped


def test_a_process_tree_lists_each_listening_socket_with_its_address():
    every, loop = socket.socket(), socket.socket()
    try:
        every.bind(("0.0.0.0", 0))
        loop.bind(("127.0.0.1", 0))
        every.listen(1)
        loop.listen(1)
        p_every, p_loop = every.getsockname()[1], loop.getsockname()[1]
        assert tree_listeners(os.getpid(), p_every) == [["0.0.0.0", p_every]]
        assert tree_listeners(os.getpid(), p_loop) == [["127.0.0.1", p_loop]]
    finally:
        every.close()
        loop.close()
