"""Every refusal of the network listener, on a real loopback server: the token (401 with no
detail, 429 past 10 failures a second), the Host allow-list (421), the Origin allow-list
(403) and CORS preflights, on plain requests and on the WebSocket upgrade; the transport's own
rules (415, 406, 400, 404, 501, 413); the connection limit shared with the Unix socket."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import trio
from net_support import (
    DEADLINE,
    INITIALIZE,
    SseReader,
    net_host,
    rpc,
    token_free,
    websocket_handshake,
)

from maple_acp.net import MAX_AUTH_FAILURES_PER_S, HttpSetupError, NetworkSettings

JSON = {"Content-Type": "application/json"}
ALLOWED_ORIGIN = "https://ide.example"


async def test_a_request_without_the_right_token_gets_401_with_no_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    async with net_host() as host, host.client() as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
            answer = await client.post(host.url, content=INITIALIZE, headers={**JSON, **headers})
            assert answer.status_code == 401
            assert answer.content == b""
            assert answer.headers.get("www-authenticate") == "Bearer"
        # A prefix of the right token is as wrong as any other.
        prefix = {"Authorization": f"Bearer {host.token[:-1]}"}
        answer = await client.post(host.url, content=INITIALIZE, headers={**JSON, **prefix})
        assert answer.status_code == 401
        # The right one passes.
        answer = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert answer.status_code == 200
    assert "missing or wrong bearer token" in caplog.text
    assert token_free(caplog.text, host.token)


async def test_more_than_ten_failures_a_second_from_one_address_get_429() -> None:
    async with net_host() as host, host.client() as client:
        wrong = {**JSON, "Authorization": "Bearer x"}
        for _ in range(MAX_AUTH_FAILURES_PER_S):
            bad = await client.post(host.url, content=INITIALIZE, headers=wrong)
            assert bad.status_code == 401
        throttled = await client.post(host.url, content=INITIALIZE, headers=wrong)
        assert throttled.status_code == 429
        missing = await websocket_handshake(host)
        assert (missing.accepted, missing.status) == (False, 429)
        # The right token is admitted all the same: the address is shared by every local
        # account (and by every client behind a proxy).
        answer = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert answer.status_code == 200
        upgrade = await websocket_handshake(host, headers=host.headers())
        assert upgrade.accepted
        # The window is one second: past it, a wrong token is a 401 again.
        await trio.sleep(1.05)
        bad = await client.post(host.url, content=INITIALIZE, headers=wrong)
        assert bad.status_code == 401


async def test_a_flood_of_wrong_tokens_from_the_owner_s_address_costs_the_owner_nothing() -> None:
    async with net_host() as host, host.client() as owner, host.client() as neighbour:
        auth = host.headers()
        opened = await owner.post(host.url, content=INITIALIZE, headers={**auth, **JSON})
        assert opened.status_code == 200
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        flooded: list[int] = []
        statuses: set[int] = set()
        throttled = trio.Event()

        async def flood() -> None:
            wrong = {**JSON, "Authorization": "Bearer not-the-token"}
            while True:
                answer = await neighbour.post(host.url, content=INITIALIZE, headers=wrong)
                statuses.add(answer.status_code)
                flooded.append(answer.status_code)
                if answer.status_code == 429:
                    throttled.set()

        sse = {**auth, **connection, "Accept": "text/event-stream"}
        with trio.fail_after(DEADLINE):
            async with (
                trio.open_nursery() as nursery,
                owner.stream("GET", host.url, headers=sse) as stream,
            ):
                assert stream.status_code == 200
                events = SseReader(stream)
                nursery.start_soon(flood)
                await throttled.wait()
                # Every POST of the owner's is taken and answered while the address is
                # throttled, and its WebSocket upgrade is accepted.
                for n in range(1, 9):
                    answer = await owner.post(
                        host.url,
                        content=rpc("session/list", {}, n),
                        headers={**auth, **JSON, **connection},
                    )
                    assert answer.status_code == 202, answer.status_code
                    _, listed = await events.until(lambda m, n=n: m.get("id") == n)
                    assert listed["result"] == {"sessions": []}
                    if n % 3 == 0:
                        # (Two at most: each takes a connection slot until its close is seen.)
                        upgrade = await websocket_handshake(host, headers=auth)
                        assert upgrade.accepted
                nursery.cancel_scope.cancel()
        assert statuses == {401, 429}
        assert flooded.count(429) > flooded.count(401)


async def test_cut_requests_and_half_open_sockets_are_not_failed_authentications() -> None:
    async with net_host() as host, host.client() as client:
        address, port = host.address
        for n in range(3 * MAX_AUTH_FAILURES_PER_S):
            stream = await trio.open_tcp_stream(address, port)
            if n % 2:
                # Headers cut off before their end, a wrong token among them.
                await stream.send_all(
                    f"POST /acp HTTP/1.1\r\nHost: {address}:{port}\r\n"
                    "Authorization: Bearer x\r\n".encode()
                )
            await stream.aclose()
        wrong = {**JSON, "Authorization": "Bearer x"}
        bad = await client.post(host.url, content=INITIALIZE, headers=wrong)
        assert bad.status_code == 401


async def test_a_host_header_that_does_not_name_the_listener_gets_421() -> None:
    async with net_host(allowed_hosts=("acp.example",)) as host, host.client() as client:
        port = host.address[1]
        for name in (
            "evil.example",
            f"evil.example:{port}",
            "127.0.0.2",
            "[::1]evil.example",
            "[::1]@evil.example",
            f"[127.0.0.1]:{port}",
        ):
            answer = await client.post(
                host.url, content=INITIALIZE, headers=host.headers(**JSON, Host=name)
            )
            assert answer.status_code == 421, name
            upgrade = await websocket_handshake(host, headers=host.headers(), host_header=name)
            assert (upgrade.accepted, upgrade.status) == (False, 421)
        for name in (
            f"localhost:{port}",
            f"127.0.0.1:{port}",
            f"[::1]:{port}",
            "acp.example",
            "ACP.example.",
        ):
            answer = await client.post(
                host.url, content=INITIALIZE, headers=host.headers(**JSON, Host=name)
            )
            assert answer.status_code == 200, name


async def test_an_origin_outside_the_list_gets_403_and_cors_only_for_allowed_ones() -> None:
    async with net_host(allowed_origins=(ALLOWED_ORIGIN,)) as host, host.client() as client:
        evil = await client.post(
            host.url,
            content=INITIALIZE,
            headers=host.headers(**JSON, Origin="https://evil.example"),
        )
        assert evil.status_code == 403
        assert "access-control-allow-origin" not in evil.headers
        upgrade = await websocket_handshake(
            host, headers={**host.headers(), "Origin": "https://evil.example"}
        )
        assert (upgrade.accepted, upgrade.status) == (False, 403)
        preflight_evil = await client.options(
            host.url,
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight_evil.status_code == 403
        assert "access-control-allow-origin" not in preflight_evil.headers
        preflight = await client.options(
            host.url,
            headers={"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        allowed = await client.post(
            host.url, content=INITIALIZE, headers=host.headers(**JSON, Origin=ALLOWED_ORIGIN)
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "acp-connection-id" in allowed.headers["access-control-expose-headers"]
        upgrade = await websocket_handshake(
            host, headers={**host.headers(), "Origin": ALLOWED_ORIGIN}
        )
        assert upgrade.accepted


async def test_no_origin_list_means_no_browser_page_is_allowed() -> None:
    async with net_host() as host, host.client() as client:
        answer = await client.post(
            host.url, content=INITIALIZE, headers=host.headers(**JSON, Origin="http://127.0.0.1")
        )
        assert answer.status_code == 403


async def test_the_websocket_token_may_come_as_a_subprotocol() -> None:
    async with net_host() as host:
        bearer = f"acp.bearer.{host.token}"
        offered = await websocket_handshake(host, subprotocols=["acp", bearer])
        assert offered.accepted
        # "acp" is chosen when offered, so the token is not echoed back.
        assert offered.subprotocol == "acp"
        assert offered.headers["acp-connection-id"]
        alone = await websocket_handshake(host, subprotocols=[bearer])
        assert alone.accepted
        assert alone.subprotocol == bearer
        wrong = await websocket_handshake(host, subprotocols=["acp", "acp.bearer.nope"])
        assert (wrong.accepted, wrong.status) == (False, 401)
        missing = await websocket_handshake(host)
        assert (missing.accepted, missing.status) == (False, 401)


async def test_streamable_http_refuses_what_the_transport_does_not_allow() -> None:
    async with net_host() as host, host.client() as client:
        auth = host.headers()
        # Content-Type must be JSON.
        answer = await client.post(host.url, content=INITIALIZE, headers=auth)
        assert answer.status_code == 415
        # A batch is not served over HTTP.
        batch = b"[" + INITIALIZE + b"]"
        answer = await client.post(host.url, content=batch, headers={**auth, **JSON})
        assert answer.status_code == 501
        answer = await client.post(host.url, content=b"{not json", headers={**auth, **JSON})
        assert answer.status_code == 400
        # An initialize without an id (a notification) cannot be answered in its POST.
        no_id = b'{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":1}}'
        answer = await client.post(host.url, content=no_id, headers={**auth, **JSON})
        assert answer.status_code == 400
        # Anything but initialize needs a connection; an unknown one is 404.
        list_sessions = rpc("session/list", {}, 1)
        answer = await client.post(host.url, content=list_sessions, headers={**auth, **JSON})
        assert answer.status_code == 400
        answer = await client.post(
            host.url, content=list_sessions, headers={**auth, **JSON, "Acp-Connection-Id": "x"}
        )
        assert answer.status_code == 404
        # A GET stream needs Accept: text/event-stream and a known connection.
        answer = await client.get(host.url, headers=auth)
        assert answer.status_code == 406
        sse = {**auth, "Accept": "text/event-stream"}
        answer = await client.get(host.url, headers=sse)
        assert answer.status_code == 400
        answer = await client.get(host.url, headers={**sse, "Acp-Connection-Id": "x"})
        assert answer.status_code == 404
        answer = await client.delete(host.url, headers=auth)
        assert answer.status_code == 400
        answer = await client.get(host.url.replace("/acp", "/other"), headers=sse)
        assert answer.status_code == 404

        opened = await client.post(host.url, content=INITIALIZE, headers={**auth, **JSON})
        assert opened.status_code == 200
        assert orjson.loads(opened.content)["result"]["protocolVersion"] == 1
        connection = {"Acp-Connection-Id": opened.headers["acp-connection-id"]}
        # A session stream for an id that exists nowhere is 404.
        answer = await client.get(
            host.url, headers={**sse, **connection, "Acp-Session-Id": "no-such-session"}
        )
        assert answer.status_code == 404
        # A prompt must name its session in Acp-Session-Id too, the same one.
        prompt = rpc("session/prompt", {"sessionId": "s1", "prompt": []}, 2)
        answer = await client.post(host.url, content=prompt, headers={**auth, **JSON, **connection})
        assert answer.status_code == 400
        answer = await client.post(
            host.url,
            content=prompt,
            headers={**auth, **JSON, **connection, "Acp-Session-Id": "s2"},
        )
        assert answer.status_code == 400
        # A body past the frame cap is refused whole.
        big = b'{"jsonrpc":"2.0","method":"x","params":"' + b"a" * (10 * 1024 * 1024) + b'"}'
        answer = await client.post(host.url, content=big, headers={**auth, **JSON, **connection})
        assert answer.status_code == 413
        # The connection is still usable after every refusal.
        async with client.stream("GET", host.url, headers={**sse, **connection}) as stream:
            assert stream.status_code == 200
            events = SseReader(stream)
            answer = await client.post(
                host.url, content=rpc("session/list", {}, 3), headers={**auth, **JSON, **connection}
            )
            assert answer.status_code == 202
            with trio.fail_after(DEADLINE):
                _, listed = await events.until(lambda m: m.get("id") == 3)
            assert listed["result"] == {"sessions": []}
            # A blank session id is the protocol's to refuse, not the transport's.
            blank = rpc("session/prompt", {"sessionId": "  ", "prompt": []}, 4)
            answer = await client.post(
                host.url, content=blank, headers={**auth, **JSON, **connection}
            )
            assert answer.status_code == 202
            with trio.fail_after(DEADLINE):
                _, refused = await events.until(lambda m: m.get("id") == 4)
            assert refused["error"]["code"] == -32602
            # DELETE ends it: the stream ends, and the id is gone.
            ended = await client.delete(host.url, headers={**auth, **connection})
            assert ended.status_code == 202
            with trio.fail_after(DEADLINE), pytest.raises(StopAsyncIteration):
                await drain(events)
        with trio.fail_after(DEADLINE):
            while True:
                gone = await client.delete(host.url, headers={**auth, **connection})
                if gone.status_code == 404:
                    break
                await trio.sleep(0.01)


async def drain(events: SseReader) -> None:
    while True:
        await events.next()


async def test_network_connections_count_in_the_host_connection_limit() -> None:
    async with net_host(max_connections=2) as host, host.client() as client:
        first = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert first.status_code == 200
        upgrade = await websocket_handshake(host, headers=host.headers())
        assert upgrade.accepted
        # The WebSocket above closed at once; wait for its slot to come back, then take it
        # with a second Streamable HTTP connection and see the third refused.
        with trio.fail_after(DEADLINE):
            while True:
                if host.lifecycle.acp.status().connections == 1:
                    break
                await trio.sleep(0.01)
        second = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert second.status_code == 200
        third = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert third.status_code == 503
        refused = await websocket_handshake(host, headers=host.headers())
        assert (refused.accepted, refused.status) == (False, 503)
        # The Unix socket counts in the same limit: it is closed at accept now.
        stream = await trio.open_unix_socket(str(host.socket))
        with trio.fail_after(DEADLINE):
            assert await stream.receive_some(10) == b""
        await stream.aclose()


def test_a_non_loopback_bind_without_tls_is_refused_in_one_line(tmp_path: Path) -> None:
    settings = NetworkSettings(host="0.0.0.0", port=8765, data_dir=tmp_path)
    with pytest.raises(HttpSetupError) as refused:
        settings.check()
    assert "\n" not in str(refused.value)
    assert "TLS" in str(refused.value)
    NetworkSettings(host="127.0.0.1", port=8765, data_dir=tmp_path).check()
    NetworkSettings(host="::1", port=8765, data_dir=tmp_path).check()
    with pytest.raises(HttpSetupError):
        NetworkSettings(
            host="127.0.0.1", port=8765, data_dir=tmp_path, tls_cert=tmp_path / "c"
        ).check()


def test_without_hypercorn_serve_http_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "hypercorn.config", None)
    settings = NetworkSettings(host="127.0.0.1", port=8765, data_dir=tmp_path)
    with pytest.raises(HttpSetupError) as refused:
        settings.check_server_installed()
    assert "pip install 'maple-acp[http]'" in str(refused.value)
    assert "\n" not in str(refused.value)


async def test_a_client_gone_in_the_middle_of_its_body_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    async with net_host() as host, host.client() as client:
        address, port = host.address
        stream = await trio.open_tcp_stream(address, port)
        # A request cut off after its headers and a few bytes of its body.
        head = (
            f"POST /acp HTTP/1.1\r\nHost: {address}:{port}\r\n"
            f"Authorization: Bearer {host.token}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n"
        )
        await stream.send_all(head.encode() + b'{"jsonrpc"')
        await trio.sleep(0.1)
        await stream.aclose()
        await trio.sleep(0.1)
        answer = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert answer.status_code == 200
    assert not [r for r in caplog.records if r.levelno >= 40], caplog.text
