"""Browsers as they are, over HTTP on a real loopback listener: an allowed origin's preflight
and answers carry ``Access-Control-Allow-Credentials`` (a page's fetch sends credentials by
default); a preflight asking for Private Network Access is granted to an allowed origin;
``allowed_origins`` entries must be ``scheme://host[:port]`` (``serve`` and ``doctor`` name a
bad one); the 403 log line names the refused origin, bounded, never the token."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from net_support import DEADLINE, INITIALIZE, net_host, token_free

from maple_acp.cli import cli
from maple_acp.net import GuardPolicy, HttpSetupError, NetworkSettings, origin_problem

JSON = {"Content-Type": "application/json"}
ALLOWED = "https://ide.example"
PREFLIGHT = {
    "Origin": ALLOWED,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


async def test_an_allowed_origin_may_send_credentials() -> None:
    async with net_host(allowed_origins=(ALLOWED,)) as host, host.client() as client:
        preflight = await client.options(host.url, headers=PREFLIGHT)
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == ALLOWED
        assert preflight.headers["access-control-allow-credentials"] == "true"
        # Not asked for: not granted.
        assert "access-control-allow-private-network" not in preflight.headers
        answer = await client.post(
            host.url, content=INITIALIZE, headers=host.headers(**JSON, Origin=ALLOWED)
        )
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-credentials"] == "true"
        # A refusal the page must be able to read (a wrong token) says so too.
        wrong = await client.post(
            host.url,
            content=INITIALIZE,
            headers={**JSON, "Authorization": "Bearer x", "Origin": ALLOWED},
        )
        assert wrong.status_code == 401
        assert wrong.headers["access-control-allow-credentials"] == "true"
        # No origin, no CORS headers at all.
        plain = await client.post(host.url, content=INITIALIZE, headers=host.headers(**JSON))
        assert plain.status_code == 200
        assert "access-control-allow-credentials" not in plain.headers


async def test_a_private_network_preflight_is_granted_to_an_allowed_origin_only() -> None:
    private = {"Access-Control-Request-Private-Network": "true"}
    async with net_host(allowed_origins=(ALLOWED,)) as host, host.client() as client:
        granted = await client.options(host.url, headers={**PREFLIGHT, **private})
        assert granted.status_code == 204
        assert granted.headers["access-control-allow-private-network"] == "true"
        assert granted.headers["access-control-allow-credentials"] == "true"
        evil = {**PREFLIGHT, **private, "Origin": "https://evil.example"}
        refused = await client.options(host.url, headers=evil)
        assert refused.status_code == 403
        assert "access-control-allow-private-network" not in refused.headers
        assert "access-control-allow-origin" not in refused.headers


@pytest.mark.parametrize(
    "entry",
    [
        "*",
        "127.0.0.1:8801",
        "localhost",
        "ide.example",
        "https://",
        "ftp://ide.example",
        "https://ide.example/",
        "https://ide.example/app",
        "https://ide.example?x=1",
        "https://ide.example#top",
        "https://user@ide.example",
        "https://*.ide.example",
        "https://ide.example:",
        "https://ide.example:99999",
        "https://ide.example:http",
        "https://[127.0.0.1]",
        "https://[::1]x",
        " https://ide.example",
        "https://ide.example\n",
        "null",
        "",
    ],
)
def test_an_allowed_origin_that_no_browser_could_send_is_refused_by_name(
    tmp_path: Path, entry: str
) -> None:
    problem = origin_problem(entry)
    assert problem is not None
    assert repr(entry) in problem
    assert "\n" not in problem
    settings = NetworkSettings(
        host="127.0.0.1", port=8765, data_dir=tmp_path, allowed_origins=(ALLOWED, entry)
    )
    with pytest.raises(HttpSetupError) as refused:
        settings.check()
    assert str(refused.value) == problem


@pytest.mark.parametrize(
    "entry",
    [
        "https://ide.example",
        "http://localhost:3000",
        "HTTPS://IDE.Example:443",
        "http://127.0.0.1:8801",
        "http://[::1]:8801",
        "https://a-b.c.example",
    ],
)
def test_an_origin_as_browsers_send_it_is_accepted(tmp_path: Path, entry: str) -> None:
    assert origin_problem(entry) is None
    NetworkSettings(
        host="127.0.0.1", port=8765, data_dir=tmp_path, allowed_origins=(entry,)
    ).check()


def test_an_origin_is_matched_as_a_browser_sends_it() -> None:
    policy = GuardPolicy.for_bind(
        "127.0.0.1", origins=("HTTPS://IDE.Example:443", "http://tool.example:80", "http://a:8080")
    )
    assert policy.allowed_origins == {
        "https://ide.example",
        "http://tool.example",
        "http://a:8080",
    }


def test_a_long_bad_origin_is_named_bounded() -> None:
    problem = origin_problem("https://" + "a" * 5000 + "/")
    assert problem is not None
    assert len(problem) < 400


def test_serve_and_doctor_name_a_bad_allowed_origin(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[http]\nlisten = "127.0.0.1:0"\nallowed_origins = ["https://ide.example", "*"]\n'
    )
    common = ["--config", str(config), "--socket", str(tmp_path / "run" / "s.sock")]
    data = ["--data-dir", str(tmp_path / "data")]
    # A process of its own, bounded: a listener that started anyway must not hang the suite.
    served = subprocess.run(
        [sys.executable, "-m", "maple_acp._main", "serve", *common, *data],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert served.returncode == 1
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "the allowed origin '*' is not scheme://host[:port]" in lines[0]
    assert not (tmp_path / "data" / "tasks.sqlite3").exists()
    doctor = CliRunner().invoke(cli, ["doctor", *common, *data])
    listener = [line for line in doctor.output.splitlines() if "network listener" in line]
    assert len(listener) == 1
    assert listener[0].startswith("✗ network listener: the allowed origin '*'")
    assert doctor.exit_code != 0


async def test_the_403_line_names_the_refused_origin_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="maple_acp.net")
    long_origin = "https://" + "x" * 1000 + ".example"
    async with net_host(allowed_origins=(ALLOWED,)) as host, host.client() as client:
        for origin in ("https://evil.example", long_origin):
            refused = await client.post(
                host.url, content=INITIALIZE, headers=host.headers(**JSON, Origin=origin)
            )
            assert refused.status_code == 403
    lines = [r for r in caplog.records if "refused a request" in r.getMessage()]
    assert len(lines) == 2
    # The first of the address is the INFO line; its repeat goes to DEBUG, as any repeat.
    assert lines[0].levelno == logging.INFO
    assert lines[0].getMessage() == (
        "refused a request from 127.0.0.1 (403): an Origin that is not allowed: "
        "'https://evil.example'"
    )
    assert "x" * 150 in lines[1].getMessage()
    assert len(lines[1].getMessage()) < 400
    assert token_free(caplog.text, host.token)
