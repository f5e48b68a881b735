"""Runs the config file fuzz target under Hypothesis: TOML documents built from the keys
``serve`` and the provider backend read, with values of every TOML type."""

from __future__ import annotations

import string
from collections.abc import Callable

from fuzz_targets import load_fuzz_target
from hypothesis import example, given, settings
from hypothesis import strategies as st

_target = load_fuzz_target("fuzz_config")
fuzz_one: Callable[[bytes], None] = _target.fuzz_one

_KEYS = [
    "socket",
    "data_dir",
    "allowed_roots",
    "max_connections",
    "grace",
    "relay_allow",
    "log_level",
    "log_format",
    "default_model",
    "system_prompt",
    "unknown_key",
]
_PROVIDER_KEYS = ["name", "base_url", "api_key_env", "models", "context_window", "extra"]
_safe_text = st.text(alphabet=string.ascii_letters + string.digits + "/:._-~@ ", max_size=24)
_values = st.one_of(
    _safe_text.map(lambda text: f'"{text}"'),
    st.integers(-3, 20).map(str),
    st.sampled_from(
        ["1.5", "0", "-0.0", "nan", "1e300", "true", "false", '"INFO"', '"json"', '"/abs"', '"~"']
    ),
    st.lists(_safe_text.map(lambda text: f'"{text}"'), max_size=3).map(
        lambda items: "[" + ", ".join(items) + "]"
    ),
    st.sampled_from(['["GITHUB_TOKEN"]', '["A", "A"]', '["/a", "rel"]', '"p/m"', '"/m"']),
)
_urls = st.sampled_from(
    [
        '"http://localhost:11434/v1"',
        '"https://openrouter.ai/api/v1/"',
        '"http://u:p@h/v1"',
        '"ftp://h"',
        '"http://h:99999"',
        '"http://h/#x"',
        '"http:// h"',
    ]
)


@st.composite
def _documents(draw: st.DrawFn) -> str:
    lines = [
        f"{key} = {draw(_values)}" for key in draw(st.lists(st.sampled_from(_KEYS), unique=True))
    ]
    for _ in range(draw(st.integers(0, 3))):
        lines.append("[[providers]]")
        for key in draw(st.lists(st.sampled_from(_PROVIDER_KEYS), unique=True)):
            value = draw(_urls) if key == "base_url" else draw(_values)
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


@settings(max_examples=200)
@given(_documents())
@example('default_model = "p/m"\n[[providers]]\nname = "p"\nbase_url = "http://h/v1"\n')
def test_documents(document: str) -> None:
    fuzz_one(document.encode())


@settings(max_examples=100)
@given(st.binary(max_size=200))
def test_raw_bytes(data: bytes) -> None:
    fuzz_one(data)


def test_a_key_with_a_newline_is_named_on_one_line() -> None:
    fuzz_one(b'"key\\nwith newline" = 1\n')


def test_infinite_grace_is_refused_by_the_config_file() -> None:
    fuzz_one(b"grace = inf\n")
