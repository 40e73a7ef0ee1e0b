"""The package's own msgpack (python/ordo/_codec.cpp): the bytes and objects of msgpack-python's
Packer(use_bin_type=True) and unpackb(raw=False, strict_map_key=False), its errors, bytes that
are not msgpack, and a package that works with no msgpack module at all."""
import array
import os
import random
import subprocess
import sys

import msgpack
import pytest

from conftest import BUILD
from ordo import _ordo

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _unpack(b, **kw):
    return msgpack.unpackb(b, raw=False, strict_map_key=False, **kw)


EDGES = [None, True, False, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63,
         2**64 - 1, -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63,
         1.5, -0.0, float("inf"), "", "a" * 31, "a" * 32, "a" * 255, "a" * 256, "é" * 40000,
         b"", b"x" * 255, b"x" * 256, b"x" * 70000, bytearray(b"ab"), memoryview(b"abc"),
         [], [1] * 15, [1] * 16, [1] * 70000, (1, 2), {}, {"a": 1},
         {i: i for i in range(16)}, {i: i for i in range(70000)}, [[[[1]]]],
         {"k": [b"v", {"z": None}], 7: -7, b"b": 1.25}]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(10 if depth < 6 else 7)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-2**63, 2**64 - 1) >> rng.randrange(64)
    if kind == 2:
        return rng.uniform(-1e300, 1e300)
    if kind == 3:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xd7ff)]))
                       for _ in range(rng.randrange(40)))
    if kind in (4, 5, 6):
        return rng.randbytes(rng.choice([0, 1, 31, 255, 256, 1000]))
    if kind == 7:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(20))]
    if kind == 8:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(5)))
    return {rng.choice([rng.randrange(1000), str(rng.random())]): _random_value(rng, depth + 1)
            for _ in range(rng.randrange(8))}


def test_the_same_bytes_and_objects_as_msgpack_python():
    rng = random.Random(55)
    values = EDGES + [_random_value(rng) for _ in range(2000)]
    for v in values:
        b = _ordo.packb(v)
        assert b == _pack(v), repr(v)[:80]
        assert _ordo.unpackb(b) == _unpack(b), repr(v)[:80]


def test_what_does_not_pack_is_the_error_msgpack_python_raises():
    for bad, err in [(object(), TypeError), ({1, 2}, TypeError), (2**64, OverflowError),
                     (-2**63 - 1, OverflowError), ("\ud800", UnicodeEncodeError)]:
        with pytest.raises(err):
            _pack(bad)
        with pytest.raises(err):
            _ordo.packb(bad)
    deep = []
    for _ in range(600):
        deep = [deep]
    with pytest.raises(ValueError, match="recursion limit"):
        _ordo.packb(deep)
    with pytest.raises(TypeError, match="can not serialize 'object' object"):
        _ordo.packb([1, object()])


def test_bytes_that_are_not_one_object_are_a_value_error():
    cases = [b"", b"\x92\x01", b"\xc1", b"\x01\x02", b"\xdd\xff\xff\xff\xff",
             b"\xc6\xff\xff\xff\xff", b"\xd4\x01\x02",  # an ext type
             b"\x91" * 100 + b"\x01"]  # deeper than ordo's limits (64)
    for b in cases:
        with pytest.raises(ValueError):
            _ordo.unpackb(b)
    with pytest.raises(UnicodeDecodeError):
        _ordo.unpackb(b"\xa2\xff\xfe")
    assert _ordo.unpackb(b"\xa2\xff\xfe", True) == "\udcff\udcfe"  # as the call context reads it
    with pytest.raises(TypeError):  # an unhashable key
        _ordo.unpackb(b"\x81\x90\x01")


def test_mangled_bytes_decode_or_raise_and_nothing_else():
    """A bounded fuzz of unpackb: msgpack of random values, bytes flipped, cut or added; each
    decodes to what msgpack-python decodes, or raises what it raises for bad bytes."""
    rng = random.Random(7)
    for _ in range(3000):
        b = bytearray(_pack(_random_value(rng)))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3)
            if op == 0 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 1 and b:
                del b[rng.randrange(len(b)):]
            else:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        try:
            got = _ordo.unpackb(bytes(b))
        except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
            continue
        assert got == _unpack(bytes(b))


def test_the_package_imports_and_calls_with_no_msgpack_module():
    """What `pip install .` into a bare venv gives: no msgpack-python. The package must not
    need it (a module set to None in sys.modules cannot be imported)."""
    code = """
import sys
sys.modules["msgpack"] = None
import asyncio, ordo

async def main():
    srv = ordo.Server()
    @srv.method
    async def echo(x):
        return x
    url = await srv.listen("tcp://127.0.0.1:0")
    async with await ordo.connect(url) as ch:
        v = {"a": [1, 2.5, b"\\x00", None, True], 3: "é"}
        assert await ch.echo(v) == {"a": [1, 2.5, b"\\x00", None, True], 3: "é"}
    await srv.stop()
    print("ok")

asyncio.run(main())
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BUILD / "python")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_big_bins_pack_once_into_the_same_bytes_and_unpack_as_views_when_asked():
    # Bins of 64 KiB and more are copied straight into the result (_codec.cpp, packed): the
    # bytes must be msgpack-python's, however big and small parts interleave.
    big = os.urandom(70_000)
    values = [big, [b"a", big, "s", bytearray(big), memoryview(big)[1:], {"k": big}, 3],
              [memoryview(big)] * 3, (b"x" * 65535, b"y" * 65536), {"deep": [[[big]]]}]
    for v in values:
        assert _ordo.packb(v) == _pack(v), repr(v)[:80]
    msg = _ordo.packb([b"small", big, [big]])
    copied = _ordo.unpackb(msg)
    assert [type(x) for x in copied[:2]] == [bytes, bytes] and copied == [b"small", big, [big]]
    viewed = _ordo.unpackb(bytearray(msg), False, True)
    assert type(viewed[0]) is bytes  # small bins stay bytes
    assert type(viewed[1]) is memoryview and type(viewed[2][0]) is memoryview
    assert viewed[1] == big and viewed[2][0] == big and not viewed[1].readonly
    del msg, copied
    assert bytes(viewed[2][0]) == big  # a view keeps what it views alive
    ints = array.array("i", range(40_000))  # items of 4 bytes: views are still of bytes
    packed = _ordo.packb([b"abcd", ints.tobytes()])  # 12 + 160,000 bytes: a whole number of ints
    v = _ordo.unpackb(memoryview(packed).cast("i"), False, True)[1]
    assert v.format == "B" and v.nbytes == 160_000 and v == ints.tobytes()
    with pytest.raises(BufferError):
        _ordo.packb([big, memoryview(b"ab" * 40_000)[::2]])  # not contiguous: refused


def test_packb_split_leaves_out_the_big_bin_that_ends_what_it_packs():
    big = os.urandom(300_000)
    view = memoryview(big)[10:]  # of bytes: it cannot change either
    for obj, back in [(big, big), ([1, "x", [b"s", big]], big), ((7, [view]), view),
                      ({"a": big}, big), ([big, 1], None), ([big[:1000]], None),
                      ([bytearray(big)], None), ([memoryview(bytearray(big))], None),
                      ([memoryview(bytearray(big)).toreadonly()], None),
                      (["s" * 300_000], None)]:
        front, b, size = _ordo.packb_split(obj, 1 << 18)
        whole = _ordo.packb(obj)
        assert b is back, repr(obj)[:60]
        assert size == len(whole)
        assert front + (bytes(b) if b is not None else b"") == whole, repr(obj)[:60]
    assert _ordo.packb_split([big], 1 << 20)[1] is None  # shorter than asked for
    with pytest.raises(TypeError):
        _ordo.packb_split([object()], 0)


def test_every_ordo_error_code_has_its_exception_class_named_as_in_cpp():
    # The codes come from the C++ half (_ordo.errc, built from ordo::errc's names), so that a
    # code added there without its Python class fails here.
    from ordo import _errors, _ordo
    assert _ordo.errc["peer_lost"] == 1 and _ordo.errc["permission_denied"] == 15
    for name, code in _ordo.errc.items():
        cls = _errors._by_code.get(code)
        assert cls is not None, f"no exception class for errc {name} ({code})"
        assert cls.__name__ == "".join(w.capitalize() for w in name.split("_")), (name, cls)
        assert cls.code == code
    assert set(_errors._by_code) == set(_ordo.errc.values())
