#!/usr/bin/python3
"""Foreign msgpack-rpc clients against ordo-inc-server.

pynvim's msgpack-rpc session layer (python3-pynvim) makes calls, notifications and failing
calls; raw python3-msgpack checks the byte level: pipelined requests, several messages in one
packet, one message split over many packets, method names sent as bin, and malformed input.
Streaming methods: a plain call gets the items as one array; a client speaking ordo's stream
extension (docs/protocol.md, "Streams") gets ordo.item notifications within its credit.
Usage: python_peers_test.py PATH_TO_ORDO_INC_SERVER
"""
import os
import signal
import socket
import subprocess
import sys
import time

try:
    import msgpack
    import pynvim
    from pynvim import msgpack_rpc
except ImportError as e:  # a missing package is a failure, never a skip
    print(f"FAIL: {e}: apt-get install python3-pynvim python3-msgpack", file=sys.stderr)
    sys.exit(1)


def start_server(path):
    proc = subprocess.Popen([path, "--listen", "tcp://127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on tcp://"), line
    host, port = line[len("listening on tcp://"):].rsplit(":", 1)
    return proc, host, int(port)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def pynvim_session(host, port):
    session = msgpack_rpc.tcp_session(host, port)
    # Error replies come back as the error object itself: ordo's {"code", "message"} map.
    session.error_wrapper = lambda err: RuntimeError(repr(err))
    check(session.request("inc", 1) == 2, "inc(1)")
    before = session.request("total")
    session.request("add", 5, async_=True)  # pynvim's notification
    session.request("add", 6, async_=True)
    check(session.request("total") == before + 11, "notifications before the call")
    try:
        session.request("fail", "account 42 is frozen")
        check(False, "fail() did not fail")
    except RuntimeError as e:
        check("account 42 is frozen" in str(e), f"error text: {e}")
    try:
        session.request("no_such_method")
        check(False, "unknown method did not fail")
    except RuntimeError as e:
        check("no method" in str(e), f"method_not_found text: {e}")
    check(session.request("echo", [1, "two", {"three": 3.0}]) == [1, "two", {"three": 3.0}], "echo")
    session.close()


def read_responses(sock, unpacker, n, timeout=10):
    out = {}
    sock.settimeout(timeout)
    while len(out) < n:
        data = sock.recv(65536)
        check(data, "connection closed early")
        unpacker.feed(data)
        for msg in unpacker:
            check(msg[0] == 1, f"not a response: {msg}")
            out[msg[1]] = (msg[2], msg[3])
    return out


def raw_bytes(host, port):
    pack = msgpack.Packer(use_bin_type=True).pack
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    unpacker = msgpack.Unpacker(raw=False)

    # 500 pipelined requests in one packet: all answered, matched by id.
    sock.sendall(b"".join(pack([0, i, "inc", [i]]) for i in range(500)))
    got = read_responses(sock, unpacker, 500)
    check(all(got[i] == (None, i + 1) for i in range(500)), "pipelined results")

    # One message split over many packets, a byte at a time.
    for b in pack([0, 1000, "inc", [41]]):
        sock.sendall(bytes([b]))
        time.sleep(0.001)
    check(read_responses(sock, unpacker, 1)[1000] == (None, 42), "split message")

    # The method name as bin, as some peers send it.
    sock.sendall(pack([0, 1001, b"inc", [1]]))
    check(read_responses(sock, unpacker, 1)[1001] == (None, 2), "bin method name")

    # A notification, then a call, in one packet: in order.
    before = read_responses_one(sock, unpacker, pack, [0, 1002, "total", []])
    sock.sendall(pack([2, "add", [7]]) + pack([0, 1003, "total", []]))
    check(read_responses(sock, unpacker, 1)[1003] == (None, before + 7), "notification order")
    sock.close()

    # Malformed input closes that connection; the server says why first (an ordo.closing
    # notification [code, reason], which a foreign client may ignore) and survives.
    bad = socket.create_connection((host, port))
    bad.sendall(b"\x94\x00\x01\xc1")
    bad.settimeout(10)
    said = msgpack.Unpacker(raw=False)
    while True:
        chunk = bad.recv(4096)
        if not chunk:
            break
        said.feed(chunk)
    said = list(said)
    check(len(said) == 1 and said[0][:2] == [2, "ordo.closing"], "no ordo.closing: %r" % said)
    check("0xc1" in said[0][2][1], "the reason does not name the bad byte: %r" % said)
    bad.close()
    again = socket.create_connection((host, port))
    again.sendall(pack([0, 7, "inc", [1]]))
    check(read_responses(again, msgpack.Unpacker(raw=False), 1)[7] == (None, 2), "after malformed")
    again.close()


def read_responses_one(sock, unpacker, pack, request):
    sock.sendall(pack(request))
    err, result = read_responses(sock, unpacker, 1)[request[1]]
    check(err is None, f"error {err}")
    return result


def read_messages(sock, unpacker, n, timeout=10):
    out = []
    sock.settimeout(timeout)
    while len(out) < n:
        data = sock.recv(65536)
        check(data, "connection closed early")
        unpacker.feed(data)
        out.extend(unpacker)
    return out


def streams(host, port):
    # A msgpack-rpc client that knows nothing of streams: the items come as one array.
    session = msgpack_rpc.tcp_session(host, port)
    session.error_wrapper = lambda err: RuntimeError(repr(err))
    check(session.request("count_to", 5) == [0, 1, 2, 3, 4], "count_to as a plain call")
    check(session.request("count_batch", 3) == [0, 1, 2], "count_batch as a plain call")
    check(session.request("count_to", 0) == [], "count_to 0 as a plain call")
    session.close()

    # The stream extension by hand: window 2, then more credit, then the end with the count.
    pack = msgpack.Packer(use_bin_type=True).pack
    sock = socket.create_connection((host, port))
    unpacker = msgpack.Unpacker(raw=False)
    sock.sendall(pack([0, 1, "ordo.stream", ["count_to", [5], 2]]))
    first = read_messages(sock, unpacker, 2)
    check(first == [[2, "ordo.item", [1, 0]], [2, "ordo.item", [1, 1]]], f"first items: {first}")
    sock.settimeout(0.3)
    try:
        extra = sock.recv(65536)
        check(not extra, f"sent beyond the credit: {extra!r}")
    except socket.timeout:
        pass
    sock.sendall(pack([2, "ordo.credit", [1, 3]]))
    rest = read_messages(sock, unpacker, 4)
    check(rest == [[2, "ordo.item", [1, 2]], [2, "ordo.item", [1, 3]], [2, "ordo.item", [1, 4]],
                   [1, 1, None, 5]], f"rest: {rest}")
    # ordo.stream for a method that does not stream: a clear error.
    sock.sendall(pack([0, 2, "ordo.stream", ["inc", [1], 4]]))
    (msg,) = read_messages(sock, unpacker, 1)
    check(msg[0] == 1 and msg[1] == 2 and "does not stream" in str(msg[2]), f"inc as a stream: {msg}")
    sock.close()


def main():
    proc, host, port = start_server(sys.argv[1])
    try:
        pynvim_session(host, port)
        raw_bytes(host, port)
        streams(host, port)
    finally:
        # SIGINT stops at once; SIGTERM would drain, waiting (--drain-ms) for the pynvim session,
        # whose close() leaves its socket open.
        proc.send_signal(signal.SIGINT)
        try:
            check(proc.wait(timeout=10) == 0, "server exit status")
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    print("ok")


if __name__ == "__main__":
    main()
