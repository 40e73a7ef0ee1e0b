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

seeds = {
    "decoder": [bytes([s]) + data for s in (0, 1, 7, 63)
                for data in [p(*requests), p(*notes), p(*responses)] + malformed],
    "server": [p(r) for r in requests] + [p(*requests, *notes)] + [p(n) for n in notes]
              + malformed + [p([0, 0, "sleep_ms", [100000]], [0, 1, "ordo.cancel", [0]])],
    "client": [p(*responses), p(*reversed(responses)), p(responses[0], responses[0]),
               p([1, 99, None, 1]), p([1, 0, {"code": 7, "message": "x"}, None]),
               p([1, 1, ["neovim", "style"], None]), p([0, 0, "inc", [1]]),
               p([2, "add", [1]]), p([1, 0, None, [1, {"a": b"b"}]])] + malformed,
}

for target, inputs in seeds.items():
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for data in inputs:
        with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:12]), "wb") as f:
            f.write(data)
