"""Callers with names in Python: a Server with auth_tokens, tokens presented by the URL's
token_file=, Peer.identity in handlers, and methods restricted to subjects."""
import os

import pytest

import ordo

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"


@pytest.fixture
def token_files(tmp_path):
    table = tmp_path / "tokens"
    table.write_text(f"# token subject\n{ALICE} alice\n{BOB} bob\n")
    alice = tmp_path / "alice"
    alice.write_text(ALICE + "\n")
    bob = tmp_path / "bob"
    bob.write_text(BOB + "\n")
    for f in (table, alice, bob):
        f.chmod(0o600)  # tokens are secrets: a file others may read is refused
    return str(table), str(alice), str(bob)


def identity_server(**options):
    srv = ordo.Server(**options)

    @srv.method(with_peer=True)
    def whoami(peer) -> list:
        who = peer.identity
        return [who.subject, who.token_subject, who.address, list(who.unix or ())]

    @srv.method(allow=["alice"])
    def secret() -> str:
        return "for alice"

    @srv.method
    def inc(x: int) -> int:
        return x + 1

    return srv


async def test_a_token_names_the_caller_and_a_missing_one_is_refused(token_files):
    table, alice, bob = token_files
    srv = identity_server(auth_tokens=table)
    url = await srv.listen("tcp://127.0.0.1:0")
    a = await ordo.connect(url + "?token_file=" + alice)
    subject, token_subject, address, _ = await a.whoami()
    assert (subject, token_subject) == ("alice", "alice")
    assert address.startswith("tcp://127.0.0.1:")
    assert await a.secret() == "for alice"
    b = await ordo.connect(url + "?token_file=" + bob)
    assert (await b.whoami())[0] == "bob"
    with pytest.raises(ordo.PermissionDenied) as denied:
        await b.secret()
    assert 'method "secret"' in str(denied.value) and "bob" in str(denied.value)
    assert await b.inc(1) == 2  # the connection goes on
    nobody = await ordo.connect(url)
    with pytest.raises(ordo.Unauthenticated) as refused:
        await nobody.inc(1)
    assert "requires a token" in str(refused.value)
    for ch in (a, b, nobody):
        ch.close()
    await srv.stop()


async def test_over_unix_the_identity_has_the_callers_process(tmp_path):
    srv = identity_server()
    url = await srv.listen("unix://" + str(tmp_path / "s.sock"))
    ch = await ordo.connect(url)
    subject, _, _, unix = await ch.whoami()
    assert subject == ""  # nothing authenticated the caller
    assert unix[0] == os.getuid() and unix[2] == os.getpid()
    with pytest.raises(ordo.PermissionDenied):
        await ch.secret()  # no subject: no rule lets it in
    ch.close()
    await srv.stop()


async def test_introspection_is_closed_unless_allowed(token_files):
    table, alice, bob = token_files
    srv = identity_server(auth_tokens=table, allow_introspection=["alice"])
    url = await srv.listen("tcp://127.0.0.1:0")
    b = await ordo.connect(url + "?token_file=" + bob)
    with pytest.raises(ordo.PermissionDenied):
        await b.call("ordo.methods")
    a = await ordo.connect(url + "?token_file=" + alice)
    assert "whoami" in await a.call("ordo.methods")
    a.close()
    b.close()
    await srv.stop()


def test_a_bad_token_file_is_named(tmp_path):
    bad = tmp_path / "tokens"
    bad.write_text("short alice\n")
    bad.chmod(0o600)
    with pytest.raises(ValueError) as e:
        ordo.Server(auth_tokens=str(bad))
    assert str(bad) in str(e.value) and "line 1" in str(e.value)


def test_a_token_file_others_may_read_is_refused(tmp_path):
    table = tmp_path / "tokens"
    table.write_text(f"{ALICE} alice\n")
    table.chmod(0o644)
    with pytest.raises(ValueError) as e:
        ordo.Server(auth_tokens=str(table))
    assert "chmod 600" in str(e.value)
    table.chmod(0o600)
    ordo.Server(auth_tokens=str(table))


async def test_a_batch_handler_takes_allow(token_files):
    table, alice, bob = token_files
    srv = ordo.Server(auth_tokens=table)
    ran = []

    @srv.batch(allow=["alice"])
    async def double(xs):
        ran.append(list(xs))
        return [x * 2 for x in xs]

    @srv.batch(allow=["alice"])
    async def count(ns):
        for step in range(max(ns)):
            yield [step if step < n else ordo.END for n in ns]

    url = await srv.listen("tcp://127.0.0.1:0")
    a = await ordo.connect(url + "?token_file=" + alice)
    b = await ordo.connect(url + "?token_file=" + bob)
    assert await a.double(21) == 42
    with pytest.raises(ordo.PermissionDenied) as denied:
        await b.double(1)
    assert "bob" in str(denied.value)
    with pytest.raises(ordo.PermissionDenied):
        async for _ in b.stream("count", 2):
            pass
    assert [x async for x in a.stream("count", 2)] == [0, 1]
    assert ran == [[21]]  # bob's call never joined a batch
    for ch in (a, b):
        ch.close()
    await srv.stop()
