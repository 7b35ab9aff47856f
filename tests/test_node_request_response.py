"""The request/response layer (`node.exchange.request_response`) over real hosts: a round
trip; a bad request, an oversized frame, a passed deadline and a peer over its stream
limit each give one clear error and leave the server answering the next question."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgpack
import pytest
import trio

from node.exchange.fields import Const, Fields
from node.exchange.request_response import (
    BadResponse,
    CodecError,
    ExchangeSpec,
    Inbound,
    MsgpackCodec,
    Raw,
    request,
    serve,
)
from node.host.host import FrameTooLarge, MessageTooLarge, PeerError, SwarmHost, open_host
from protocol.schema import Int, Str

QUESTION = MsgpackCodec("echo request", Fields((Const("echo"), Str(64))), 96)
ANSWER = MsgpackCodec("echo answer", Fields((Str(64), Int(0, 64))), 96)
ECHO: ExchangeSpec[tuple[str, str], tuple[str, int]] = ExchangeSpec(
    name="echo",
    protocol="/test/{run}/echo/1",
    request=QUESTION,
    response=ANSWER,
    max_streams_per_peer=1,
    deadline_s=1.0,
    bad_request="bad echo request",
)


@asynccontextmanager
async def two_hosts() -> AsyncIterator[tuple[SwarmHost, SwarmHost]]:
    async with (
        open_host(secrets.token_bytes(32)) as server,
        open_host(secrets.token_bytes(32)) as client,
    ):
        assert (await client.connect(server.listen_addrs()[0])).ok
        yield server, client


async def echo(call: Inbound[tuple[str, int]], req: tuple[str, str]) -> None:
    await call.reply((req[1], len(req[1])))


def test_codec_errors_are_one_line_and_name_the_field() -> None:
    assert QUESTION.decode(QUESTION.encode(("echo", "hi"))) == ("echo", "hi")
    with pytest.raises(CodecError, match=r"^echo request.value\[0\]: expected 'echo'$"):
        QUESTION.decode((msgpack.packb(["nope", "hi"]),))
    with pytest.raises(CodecError, match="not msgpack"):
        QUESTION.decode((b"\xc1",))
    for bad in (b"", msgpack.packb({"a": 1}), msgpack.packb(["echo"]), msgpack.packb(["echo", 1])):
        with pytest.raises(CodecError) as info:
            QUESTION.decode((bad,))
        assert "\n" not in str(info.value)


async def test_round_trip_and_the_same_bytes_as_plain_msgpack() -> None:
    async with two_hosts() as (server, client):
        seen: list[bytes] = []

        async def raw(stream) -> None:  # type: ignore[no-untyped-def]
            seen.append(await stream.receive())
            await stream.send(msgpack.packb(["hello", 5], use_bin_type=True))

        serve(server, ECHO.for_run("a"), echo)
        server.set_stream_handler(ECHO.for_run("b").protocol, raw)
        with trio.fail_after(10):
            assert await request(client, server.peer_id, ECHO.for_run("a"), ("echo", "hey")) == (
                "hey",
                3,
            )
            got = await request(client, server.peer_id, ECHO.for_run("b"), ("echo", "hello"))
        assert got == ("hello", 5)
        assert seen == [msgpack.packb(["echo", "hello"], use_bin_type=True)]


async def test_bad_request_is_charged_and_the_server_answers_the_next() -> None:
    charged: list[tuple[str, str]] = []
    async with two_hosts() as (server, client):
        serve(server, ECHO, echo, on_bad_request=lambda p, why: charged.append((p, why)))
        with trio.fail_after(10):
            stream = await client.open_stream(server.peer_id, ECHO.protocol)
            await stream.send(msgpack.packb(["echo", 7]))
            with pytest.raises(PeerError):
                await stream.receive()  # the server ended the stream, answering nothing
            await stream.close()
            assert charged == [(client.peer_id, "bad echo request")]
            assert await request(client, server.peer_id, ECHO, ("echo", "ok")) == ("ok", 2)


async def test_oversized_frames_are_refused_each_way() -> None:
    charged: list[str] = []
    async with two_hosts() as (server, client):
        serve(server, ECHO, echo, on_bad_request=lambda p, why: charged.append(why))
        big: ExchangeSpec[bytes, bytes] = ExchangeSpec("big", "/test/big/1", Raw(4096), Raw(4096))

        async def too_much(call: Inbound[bytes], req: bytes) -> None:
            await call.reply(b"x" * 4000)

        serve(server, big, too_much)
        small = ExchangeSpec("big", "/test/big/1", Raw(4096), Raw(100))
        with trio.fail_after(10):
            # a request over the server's cap: the stream is reset, nobody is charged
            stream = await client.open_stream(server.peer_id, ECHO.protocol)
            await stream.send(b"\x90" * 500)
            with pytest.raises(PeerError):
                await stream.receive()
            await stream.close()
            # an answer over the client's cap
            with pytest.raises(FrameTooLarge, match=r"announced a 4000 byte frame \(cap 100\)"):
                await request(client, server.peer_id, small, b"q")
            # our own message over its cap is our bug, raised before anything is sent
            with pytest.raises(MessageTooLarge):
                await request(client, server.peer_id, small, b"q" * 5000)
            assert await request(client, server.peer_id, ECHO, ("echo", "still")) == ("still", 5)
        assert charged == []


async def test_a_bad_answer_is_a_bad_response() -> None:
    async with two_hosts() as (server, client):

        async def liar(stream) -> None:  # type: ignore[no-untyped-def]
            await stream.receive()
            await stream.send(msgpack.packb(["x", -1]))

        server.set_stream_handler(ECHO.protocol, liar)
        with trio.fail_after(10), pytest.raises(BadResponse, match=r"echo answer.value\[1\]"):
            await request(client, server.peer_id, ECHO, ("echo", "x"))


async def test_deadline_and_stream_limit() -> None:
    refused: list[str] = []
    release = trio.Event()
    async with two_hosts() as (server, client):

        async def slow(call: Inbound[tuple[str, int]], req: tuple[str, str]) -> None:
            if req[1] == "wait":
                await release.wait()
            await echo(call, req)

        serve(server, ECHO, slow, on_refused=refused.append)
        with trio.fail_after(20):
            # past the 1 s deadline the server closes the stream: the client hears it
            start = trio.current_time()
            with pytest.raises(PeerError):
                await request(client, server.peer_id, ECHO, ("echo", "wait"))
            assert trio.current_time() - start < 8
            assert refused == []
            # one stream at a time: a second one while the first waits is reset
            async with trio.open_nursery() as nursery:
                nursery.start_soon(request, client, server.peer_id, ECHO, ("echo", "wait"))
                await trio.sleep(0.3)
                with pytest.raises(PeerError):
                    await request(client, server.peer_id, ECHO, ("echo", "second"))
                release.set()
            assert refused == [client.peer_id]
            assert await request(client, server.peer_id, ECHO, ("echo", "after")) == ("after", 5)


def test_each_protocol_keeps_its_wire_bytes() -> None:
    from node.exchange import rollouts, runs, shards, sync
    from node.peer import discovery

    def pack(value: object) -> bytes:
        return msgpack.packb(value, use_bin_type=True)

    ids = [secrets.token_bytes(32) for _ in range(3)]
    assert rollouts.SPEC.request.encode(ids) == (pack(ids),)
    assert rollouts.SPEC.response.encode(None) == (b"",)
    question = (12.5, 3, b"p" * 38, 100)
    assert sync.SPEC.request.encode(question) == (pack(list(question)),)
    assert sync.SPEC.request.decode(sync.SPEC.request.encode(question)) == question
    page = (ids, [1.0, 2, 3.5], True)
    assert sync.SPEC.response.encode(page) == (pack(list(page)),)
    for req in (("watch",), ("newest",), ("manifest", ids[0]), ("shard", ids[0], 7)):
        assert shards.SPEC.request.encode(req) == (pack(list(req)),)
        assert shards.SPEC.request.decode(shards.SPEC.request.encode(req)) == req
    assert runs.SPEC.request.encode(("runs",)) == (msgpack.packb(["runs"]),)
    served = runs.ServedRun(b"rel", {"run": "r"})
    assert runs.encode_answer([served]) == pack([[b"rel", {"run": "r"}]])
    addrs = ["/ip4/1.2.3.4/tcp/1/p2p/x"]
    assert discovery.HELLO.request.encode((b"env", addrs)) == (b"env", pack(addrs))
    assert rollouts.protocol_id("r") == "/swarm-rl/r/rollout/1"
    assert sync.protocol_id("r") == "/swarm-rl/r/sync/1"
    assert shards.protocol_id("r") == "/swarm-rl/r/shard/1"
    assert discovery.hello_protocol("r") == "/swarm-rl/r/hello/1"
    assert runs.SPEC.protocol == "/swarm-rl/runs/1"
