#!/usr/bin/python3
"""Writes the seed corpus of the fuzz targets into corpus/<target>/ (valid and malformed
msgpack-rpc). Run from anywhere: /usr/bin/python3 tests/fuzz/make_seeds.py"""
import hashlib
import os

import msgpack

here = os.path.dirname(os.path.abspath(__file__))


def p(*objs):
    return b"".join(msgpack.packb(o, use_bin_type=True) for o in objs)


requests = [
    [0, 0, "inc", [1]], [0, 1, "add", [5]], [0, 2, "total", []], [0, 3, "sleep_ms", [1]],
    [0, 4, "fail", ["no"]], [0, 5, "echo", [{"a": [1, 2.5, None, b"\x00"]}]],
    [0, 6, "square_batch", [7]], [0, 7, "ordo.ping", []], [0, 8, "ordo.cancel", [3]],
    [0, 9, "nope", []], [0, 10, "inc", ["x"]], [0, 11, "inc", [1, 2]],
    [0, 4294967295, "inc", [0]],
]
notes = [[2, "add", [3]], [2, "nope", []], [2, "inc", "not an array"]]
malformed = [
    b"\xc1", b"\xdf\xff\xff\xdf\xff", b"\x91" * 40, b"\xdb\xff\xff\xff\xff",
    b"\xc6\x7f\xff\xff\xff", p([3, 0, "x", []]), p([0, -1, "inc", []]), p([0, 1, 2, []]),
    p("not an array"), p([0, 1, "inc"]), p([1, 0, None]), p([0, 1, "inc", [1]])[:-1],
]
responses = [[1, i, None, i + 1] for i in range(8)]


# Resumable sessions (docs/protocol.md): the caller's first message ordo.hello [version, session
# id (bin 16) or nil, received, window_ms], then ordo.ack [received] and ordo.bye [received]. The
# fuzzed server resumes sessions (server_options' default resume_window), and one connection
# cannot know the id it is given: an id here is always one the server never gave out.
def hello(sid=None, received=0, window=10000, msgid=100, version=1):
    return [0, msgid, "ordo.hello", [version, sid, received, window]]


def hello_params(params):
    return [0, 100, "ordo.hello", params]


def ack(n):
    return [2, "ordo.ack", [n]]


def bye(n):
    return [2, "ordo.bye", [n]]


forged = hashlib.sha256(b"ordo: a session id no server gave out").digest()[:16]
huge = 2**64 - 1
inc = [0, 0, "inc", [1]]
sessions = [
    # Fresh sessions, alone and followed by the usual traffic; window and counts at extremes.
    p(hello()), p(hello(), *requests, *notes), p(hello(msgid=4294967295), inc),
    p(hello(window=0), inc), p(hello(window=huge), inc), p(hello(window=2**63), inc),
    p(hello(received=5), inc), p(hello(received=huge, window=huge)), p(hello(version=2), inc),
    # A forged id (session_lost, then a plain session), and malformed hellos (bad_arguments).
    p(hello(forged)), p(hello(forged), inc, [2, "add", [1]], [0, 1, "total", []]),
    p(hello(forged, received=huge)), p(hello_params([])), p(hello_params([1])),
    p(hello_params([1, None, 0])), p(hello_params(["1", None, 0, 0]), inc),
    p(hello_params([1, "sixteen chars!!!", 0, 0]), inc), p(hello_params([1, forged[:15], 0, 0])),
    p(hello_params([1, forged + b"x", 0, 0])), p(hello_params([1, None, -1, 0])),
    p(hello_params([1, None, 0, -1])), p(hello_params([1, None, 0.5, 0])),
    p(hello_params([1, None, 0, 10000, "more"]), inc), p(hello_params([1, [], 0, 0])),
    p(hello_params({"id": None})), p([2, "ordo.hello", [1, None, 0, 10000]], inc),
    p([1, 100, None, [1, forged, 0, 10000]], inc),
    # ordo.ack and ordo.bye before any hello: a plain session, where they are unknown names.
    p(ack(0), inc), p(bye(0), inc), p(ack(huge), bye(huge), inc), p(inc, hello()),
    # After a hello: acks of nothing, of everything, of more than was sent; malformed acks.
    p(hello(), ack(0), inc, ack(1), [0, 1, "total", []]), p(hello(), inc, ack(huge)),
    p(hello(), ack(1)), p(hello(), ack(-1)), p(hello(), [2, "ordo.ack", []]),
    p(hello(), [2, "ordo.ack", [1, 2]]), p(hello(), [2, "ordo.ack", ["x"]]),
    p(hello(), [2, "ordo.ack", {"n": 1}]), p(hello(), *[ack(0)] * 64, inc),
    # Byes: counting nothing, more than was sent, malformed, twice, while a handler runs.
    p(hello(), bye(0)), p(hello(), inc, bye(1), inc), p(hello(), bye(huge), inc),
    p(hello(), [2, "ordo.bye", []]), p(hello(), bye(0), bye(0), ack(0)),
    p(hello(), [0, 0, "sleep_ms", [100000]], bye(0)),
    # A second hello on a session, fresh or with an id; control names in a longer string
    # encoding (str 8), which are ordinary notifications; a stream ending inside a control message.
    p(hello(), hello()), p(hello(), inc, hello(forged, received=1)),
    p(hello()) + b"\x93\x02\xd9\x08ordo.ack\x91\x00" + p(inc),
    p(hello()) + b"\x93\x02\xd9\x08ordo.bye\x91\x00" + p(inc),
    p(hello(), inc, ack(1))[:-2], p(hello())[:-3],
]


# Two connections (resume_fuzz.cpp): flags (bit 0: reset the first connection before the second
# connects; bit 1: the second ends its sending side at once, not after the answers), the first connection's length (2 bytes, big-endian), its bytes, the second's bytes.
# The second claims the first's session with the placeholder id, which the target replaces with
# the id the server gave out; the first connection's server messages are numbered from 0 (the
# hello's answer is not numbered), so after hello + 3 calls the server has sent 3.
placeholder = b"ordo-fuzz-sessid"


def two(first, second, reset_first=True, end_at_once=False):
    flags = (1 if reset_first else 0) | (2 if end_at_once else 0)
    return bytes([flags]) + len(first).to_bytes(2, "big") + first + second


calls3 = [inc, [0, 1, "add", [5]], [0, 2, "total", []]]
first3 = p(hello(), *calls3)
takeovers = [
    # Resumed after a reset, and taken over from a live connection: the caller had all 3
    # answers, some, or none (the server sends them again), then acks and goes on.
    two(first3, p(hello(placeholder, received=3, msgid=101), ack(3), [0, 3, "total", []],
                  ack(4), bye(4))),
    two(first3, p(hello(placeholder, received=3, msgid=101), [0, 3, "inc", [2]], ack(4)),
        reset_first=False),
    two(first3, p(hello(placeholder, received=1, msgid=101), ack(3), [0, 3, "total", []])),
    two(first3, p(hello(placeholder, received=0, msgid=101), ack(3), bye(3)), reset_first=False),
    # Counts that cannot match (more than the server sent), an ack of more than was sent, and
    # acks going backwards after the resume.
    two(first3, p(hello(placeholder, received=4, msgid=101), inc)),
    two(first3, p(hello(placeholder, received=3, msgid=101), ack(9), inc), reset_first=False),
    two(p(hello(), *calls3, ack(3)), p(hello(placeholder, received=3, msgid=101), ack(1), inc)),
    # A handler still running on the first connection when the second takes over, and a stream
    # whose items are cut by the reset.
    two(p(hello(), [0, 0, "sleep_ms", [5]], [0, 1, "sleep_ms", [100000]]),
        p(hello(placeholder, received=0, msgid=101), [0, 2, "ordo.cancel", [1]], ack(1)),
        reset_first=False),
    two(p(hello(), [0, 0, "ordo.stream", ["count_to", [100], 4, 1 << 20]]),
        p(hello(placeholder, received=2, msgid=101), [2, "ordo.credit", [0, 4, 64]], ack(6))),
    # Streams both ways cut midway: a client stream whose items go on (and end) on the second
    # connection, and a two-way stream taken over from a live connection, items both ways.
    two(p(hello(), [0, 0, "ordo.stream", ["sum", [], 1, 0, True]], [2, "ordo.in", [0, 1]],
          [2, "ordo.in", [0, 2]]),
        p(hello(placeholder, received=1, msgid=101), [2, "ordo.in", [0, 3]],
          [2, "ordo.in_end", [0, 3]], ack(2))),
    two(p(hello(), [0, 0, "ordo.stream", ["scale", [2], 8, 1 << 20, True]],
          *[[2, "ordo.in", [0, i]] for i in range(5)]),
        p(hello(placeholder, received=3, msgid=101), [2, "ordo.credit", [0, 8, 1024]],
          *[[2, "ordo.in", [0, i]] for i in range(5, 8)], [2, "ordo.in_end", [0, 8]], ack(9)),
        reset_first=False),
    # The first connection cut inside a message; the claim made twice; a forged id and a fresh
    # session on the second; a second connection that is not a session at all.
    two(p(hello(), *calls3)[:-3], p(hello(placeholder, received=2, msgid=101), inc)),
    two(first3, p(hello(placeholder, received=3, msgid=101),
                  hello(placeholder, received=3, msgid=102), inc), reset_first=False),
    two(first3, p(hello(forged, received=3, msgid=101), inc)),
    two(first3, p(hello(msgid=101), inc), reset_first=False),
    two(first3, p(inc, [0, 1, "total", []])),
    # The second connection's end in the same read as its hello and calls.
    two(first3, p(hello(placeholder, received=3, msgid=101), inc), end_at_once=True),
    two(first3, p(hello(placeholder, received=2, msgid=101), inc, ack(3)), reset_first=False,
        end_at_once=True),
    # No session on the first connection: the claim is for an id never given out.
    two(p(*calls3), p(hello(placeholder, received=3, msgid=101), inc), reset_first=False),
]

# The hand decoder of the envelope (rpc/wire/codec.cpp, decode_envelope): each valid kind cut at
# every byte, a wrong type in each slot, msgids at and past 32 bits in every uint width, methods
# as bin, str 8 and str 16, envelopes as array 16, and bytes after a whole message.
valid_envelopes = [p([0, 70000, "inc", [1, "x"]]), p([1, 300, None, [1]]),
                   p([1, 5, {"code": 3, "message": "m"}, None]), p([2, "add", [3]])]
envelopes = [v[:n] for v in valid_envelopes for n in range(1, len(v))]
envelopes += [p([0, i, "m", []]) for i in (0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1,
                                            2**32, 2**64 - 1)]
envelopes += [p([k, 1, "m", []]) for k in ("0", None, 3, -1, 1.5)]
envelopes += [p([0, m, "m", []]) for m in ("1", None, -1, 1.5, [1], b"\x01")]
envelopes += [p([0, 1, m, []]) for m in (7, None, b"inc", [], "m" * 31, "m" * 32, "m" * 300)]
envelopes += [p([0, 1, "m", q]) for q in ({}, "x", None, 5, {"a": 1})]
envelopes += [p([2, m, [1]]) for m in (7, b"add", "a" * 255, "a" * 256)]
envelopes += [p([1, 1, e, r]) for e in ("bad", 7, [1, 2]) for r in (None, 1)]
# Successful responses whose result the envelope decoder reads itself (a positive fixint, str
# or bin up to 255 bytes), cut at every byte, and the next sizes up, which it leaves to the
# general reader.
fast_results = [p([1, 9, None, r]) for r in (0, 127, 128, "", "s" * 31, "s" * 32, "s" * 255,
                                              "s" * 256, b"", b"b" * 255, b"b" * 256, -1)]
envelopes += [v[:n] for v in fast_results[:6] for n in range(1, len(v) + 1)] + fast_results
# The common response read first (wire_read.cpp, read_common_response): a msgid of each width
# (uint 8, 16, 32), whole and cut at every byte, and a uint 64 msgid it leaves to the reader.
wide_ids = [p([1, i, None, r]) for i in (200, 300, 70000) for r in (5, "s" * 16, b"b" * 16)]
envelopes += [v[:n] for v in wide_ids for n in range(1, len(v))] + wide_ids
# The common call read first (wire_read.cpp, read_common_call): requests with a msgid of each
# width and notifications with a str 8 method, their params of every flat type (ints of every
# width, floats, str up to 255 bytes, bin 8, nil, bools; a full fixarray of 15 among them),
# whole and, the short ones, cut at every byte; positive values sent as ints and a float 32,
# which msgpack does not write by default; and params it leaves to the general reader (array
# 16, str 16, bin 16, an ext, a nested array or map).
flat_params = [[], [0, 127, -1, -32], ["", "s" * 31, "s" * 32], ["s" * 255], [None, True, False],
               list(range(15)), [128, 65535, 70000, 2**40, 2**64 - 1],
               [-33, -129, -40000, -2**40, -2**63], [1.5, b"", b"b" * 4], [b"b" * 255]]
common_calls = [p([0, i, "inc", q]) for i in (5, 200, 300, 70000) for q in flat_params]
common_calls += [p([2, "n" * 40, q]) for q in flat_params]
common_calls += [b"\x93\x02\xa1m\x94\xd0\x05\xd1\x01\x00\xd2\x00\x01\x00\x00\xd3" + bytes(7) + b"\x01",
                 b"\x93\x02\xa1m\x91\xca\x3f\xc0\x00\x00"]
envelopes += [v[:n] for v in common_calls if len(v) <= 64 for n in range(1, len(v))]
envelopes += common_calls
envelopes += [p([0, 1, "inc", q]) for q in (list(range(16)), ["s" * 256], [b"b" * 256],
                                              [msgpack.ExtType(5, b"e")], [[1]], [{"a": 1}])]
envelopes += [b"\x94\x01\xcf\x00\x00\x00\x00\x00\x00\x00\x01\xc0\x05"]
envelopes += [p([0, 1, "m", [], 1]), p([2, "m"]), p([1, 1, None]), p([0, 1, "m"]),
              b"\xdc\x00\x04" + p(0, 1, "m", []), b"\xdd\x00\x00\x00\x03" + p(2, "m", []),
              p([0, 1, "m", []]) + b"\x00", p([2, "m", [1]]) + p([2, "m", [1]]),
              b"\x94\x00\xcf\x00\x00\x00\x00\x00\x00\x00\x01\xa1m\x90",
              b"\x93\x02\xd9\x01m\x90", b"\x93\x02\xda\x00\x01m\x90",
              b"\x93\x02\xa1m\xdc\x00\x01\x01", b"\x93\x02\xa1m\x91\xc1"]

# Call context (docs/protocol.md "Call context"): requests with a fifth element, good and bad,
# ordo.features asked well and badly, and a stream call with a deadline.
tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
contexts = [p([0, 1, "inc", [1], {"ordo-deadline-ms": 0}]),
            p([0, 2, "inc", [1], {"ordo-deadline-ms": 2**64 - 1, "k": "v", "b-bin": b"\x00"}]),
            p([0, 3, "context", [], {"traceparent": tp, "ordo-deadline-ms": 500}]),
            p([0, 4, "inc", [1], {}]), p([0, 5, "inc", [1], {"k": 1}]),
            p([0, 6, "inc", [1], {1: "v"}]), p([0, 7, "inc", [1], {"": "v"}]),
            p([0, 8, "inc", [1], {"k" * 40: "v" * 2000}]),
            p([0, 9, "inc", [1], {("k%d" % i): "v" for i in range(80)}]),
            p([0, 10, "ordo.stream", ["count_to", [3], 8], {"ordo-deadline-ms": 100}]),
            p([0, 11, "ordo.features", [["meta", "x"]]]), p([0, 12, "ordo.features", []]),
            p([0, 13, "ordo.features", ["meta"]]), p([0, 14, "inc", [1], None]),
            p([0, 0, "sleep_ms", [50]], [0, 15, "inc", [1], {"ordo-deadline-ms": 1}]),
            p([2, "add", [1], {"k": "v"}])]
envelopes += contexts

# Streams both ways (docs/protocol.md "Streams both ways"): a client stream and a two-way stream
# used well, and items beyond the credit, after the end, for unknown calls, with a wrong count,
# malformed, and to a method that does not read.
both_ways = [p([0, 11, "ordo.stream", ["sum", [], 1, 0, True, 1 << 40]],
               *[[2, "ordo.in", [11, i]] for i in range(20)], [2, "ordo.in_end", [11, 20]],
               [0, 12, "ordo.stream", ["sum", [], 1, 0, True, "big"]],
               [0, 13, "ordo.stream", ["scale", [2], 8, 1024, True, 2**64 - 1, 1]]),
             p([0, 1, "ordo.stream", ["sum", [], 1, 0, True]], [2, "ordo.in", [1, 5]],
               [2, "ordo.in", [1, 7]], [2, "ordo.in_end", [1, 2]]),
             p([0, 2, "ordo.stream", ["scale", [3], 4, 1 << 20, True]],
               *[[2, "ordo.in", [2, i]] for i in range(6)], [2, "ordo.credit", [2, 4, 64]],
               [2, "ordo.in_end", [2, 6]]),
             p([0, 3, "ordo.stream", ["sum", [], 1, 0, True]],
               *[[2, "ordo.in", [3, i]] for i in range(300)]),
             p([0, 4, "ordo.stream", ["sum", [], 1, 0, True]], [2, "ordo.in_end", [4, 0]],
               [2, "ordo.in", [4, 1]], [2, "ordo.in_end", [4, 9]]),
             p([0, 5, "ordo.stream", ["sum", [], 1, 0, True]], [2, "ordo.in", [5, "x"]],
               [2, "ordo.in", [5]], [2, "ordo.in", ["5", 1]], [2, "ordo.in_end", [5, "n"]],
               [2, "ordo.in", [99, 1]], [0, 6, "ordo.in", [5, 1]]),
             p([0, 7, "ordo.stream", ["inc", [1], 1, 0, True]], [2, "ordo.in", [7, 1]]),
             p([0, 8, "sum", []], [0, 9, "ordo.stream", ["sum", [], 1, 0, 1]]),
             p([0, 10, "ordo.stream", ["sum", [], 1, 0, True]], [0, 11, "ordo.cancel", [10]],
               [2, "ordo.cancel", [10]], [2, "ordo.in", [10, 1]])]
envelopes += both_ways

# Authentication (docs/protocol.md "Authentication"): an input that starts with a notification
# (an odd first byte) meets a server with a token table (tests/fuzz/server_fuzz.cpp).
token = {"token": "fuzz-token-0123456789"}
auths = [p([2, "ordo.auth", [token]], [0, 1, "inc", [1]], [0, 2, "ordo.methods", []]),
         p([2, "ordo.auth", [{"token": "not-the-token-000000"}]], [0, 1, "inc", [1]],
           [0, 2, "whoami", []]),
         p([2, "ordo.auth", ["just a string"]], [0, 1, "inc", [1]]),
         p([2, "ordo.auth", [token]], hello(), [0, 1, "whoami", []]),
         p([2, "add", [1]], [0, 1, "inc", [1]])]

# Lanes (docs/protocol.md "Lanes"): messages in pieces on named lanes and on the default lane,
# credit, and pieces that break the rules (sizes that disagree, over max_message_bytes, too many
# lanes, a lane name too long, a piece inside a piece, malformed params). The server's inputs
# start with a request, so that the server they meet does not authenticate.
def pieces(lane, msg, cuts):
    out, pos = [], 0
    for c in cuts + [len(msg)]:
        out.append([2, "ordo.piece", [lane, len(msg) - c, msg[pos:c]]])
        pos = c
    return out


ping = [0, 20, "ordo.ping", []]
lanes = [p(ping, *pieces("bulk", p([0, 21, "inc", [1]]), [2, 5]), [0, 22, "inc", [2]]),
         p(ping, *pieces("", p([0, 23, "echo", ["x" * 300]]), [100, 200])),
         p(ping, *pieces("a", p([0, 24, "inc", [1]]), []), *pieces("b", p([2, "add", [1]]), [1])),
         p(ping, [2, "ordo.piece", ["a", 10, b"\x94"]], [2, "ordo.piece", ["a", 3, b"\x00"]]),
         p(ping, [2, "ordo.piece", ["a", 2**40, b"\x94"]]),
         p(ping, *[[2, "ordo.piece", ["l%d" % i, 5, b"\x94"]] for i in range(70)]),
         p(ping, [2, "ordo.piece", ["x" * 100, 0, p([0, 25, "inc", [1]])]]),
         p(ping, [2, "ordo.piece", ["a", 0, p([2, "ordo.piece", ["a", 0, p([2, "add", [1]])]])]]),
         p(ping, [2, "ordo.piece", "bad"], [2, "ordo.piece", ["a", -1, b"\x90"]]),
         p(ping, [2, "ordo.lane_credit", ["a", 5]], [2, "ordo.lane_credit", ["a"]]),
         p([0, 26, "ordo.features", [["meta", "lanes"]]],
           *pieces("bulk", p([0, 27, "sleep_ms", [10]]), [3]), *pieces("bulk", p([2, "add", [2]]), []),
           *pieces("bulk", p([0, 28, "ordo.cancel", [27]]), []), [0, 29, "total", []])]
envelopes += [p(*pieces("a", p([0, 1, "inc", [1]]), [1, 3]))]
takeovers += [
    # A message in pieces cut by the reset: its pieces after the resume complete it.
    two(p(hello(), *pieces("bulk", p([0, 0, "echo", ["y" * 200]]), [50, 120])[:2]),
        p(hello(placeholder, received=0, msgid=101),
          *pieces("bulk", p([0, 0, "echo", ["y" * 200]]), [50, 120])[2:], ack(1))),
]

seeds = {
    "decoder": [bytes([s]) + data for s in (0, 1, 7, 63)
                for data in [p(*requests), p(*notes), p(*responses)] + malformed]
               + [bytes([63]) + e for e in envelopes],
    "server": [p(r) for r in requests] + [p(*requests, *notes)] + [p(n) for n in notes]
              + malformed + [p([0, 0, "sleep_ms", [100000]], [0, 1, "ordo.cancel", [0]])]
              + sessions + auths + contexts + lanes + both_ways,
    "client": [p(*responses), p(*reversed(responses)), p(responses[0], responses[0]),
               p([1, 99, None, 1]), p([1, 0, {"code": 7, "message": "x"}, None]),
               p([1, 1, ["neovim", "style"], None]), p([0, 0, "inc", [1]]),
               p([2, "add", [1]]), p([1, 0, None, [1, {"a": b"b"}]]),
               p(*pieces("bulk", p([1, 0, None, "z" * 100]), [10])),
               p(*pieces("", p([1, 0, None, 1]), [1]), [2, "ordo.lane_credit", ["a", 1]])]
              + malformed,
    "resume": takeovers,
}

for target, inputs in seeds.items():
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for data in inputs:
        with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:12]), "wb") as f:
            f.write(data)
