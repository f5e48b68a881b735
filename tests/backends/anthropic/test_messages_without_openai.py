"""``maple-acp[anthropic]`` serves an Anthropic-only configuration without the ``openai``
package: a fresh interpreter in which ``import openai`` fails (a meta path finder refuses it)
builds the backend, checks the provider, lists its models and answers a turn against the
loopback Messages server, and never imports ``openai``."""

from __future__ import annotations

import sys
from pathlib import Path

import trio
from anthropic_support import KEY_ENV, TEST_KEY
from messages_loopback import MessagesProvider, Reply, text_reply

SCRIPT = """
import importlib.abc, sys

class NoOpenAI(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "openai" or name.startswith("openai."):
            raise ImportError("the openai package is not installed here")
        return None

sys.meta_path.insert(0, NoOpenAI())

import tempfile
import trio
from maple_acp.backends import build_backend, load_provider_config, provider_policy
from maple_acp.testing.demo import DEMO_ACCOUNT, make_demo_service, run_prompt
from maple_acp.testing.store import temp_store

async def main(base_url, key_env, key, project):
    config = load_provider_config(
        {"providers": [{"name": "claude", "kind": "anthropic", "base_url": base_url,
                        "api_key_env": key_env, "models": ["test-model"]}]},
        "test config",
    )
    backend, catalog = build_backend(config, {key_env: key})
    (check,) = await catalog.check_providers()
    print("check", check.state)
    print("models", [m.id for m in await catalog.list_models(DEMO_ACCOUNT)])
    with tempfile.TemporaryDirectory() as data:
        async with backend, temp_store(data) as store:
            await backend.warm_up()
            service = make_demo_service(
                store, backend=backend, catalog=catalog, policy=provider_policy()
            )
            async with service, trio.open_nursery() as nursery:
                service.sign_in(DEMO_ACCOUNT)
                lease = await nursery.start(service.serve_new_task, project)
                events, outcome = await run_prompt(lease, "hi")
                print("outcome", outcome.state.value)
                await lease.release(close=False)
    print("openai imported", any(n == "openai" or n.startswith("openai.") for n in sys.modules))

trio.run(main, *sys.argv[1:])
"""


async def test_an_anthropic_only_configuration_never_imports_openai(
    messages_provider: MessagesProvider, project: Path
) -> None:
    messages_provider.models = Reply(
        body={
            "data": [
                {
                    "type": "model",
                    "id": "test-model",
                    "display_name": "test-model",
                    "created_at": "2026-01-01T00:00:00Z",
                }
            ],
            "has_more": False,
            "first_id": "test-model",
            "last_id": "test-model",
        }
    )
    messages_provider.add(text_reply("Hello"))
    with trio.fail_after(60):
        done = await trio.run_process(
            [
                sys.executable,
                "-c",
                SCRIPT,
                messages_provider.base_url,
                KEY_ENV,
                TEST_KEY,
                str(project),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert "check reachable" in output
    assert "models ['claude/test-model']" in output
    assert "outcome completed" in output
    assert "openai imported False" in output
    assert len(messages_provider.message_requests()) == 1
