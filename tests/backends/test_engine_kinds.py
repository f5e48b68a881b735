"""The registry of engine kinds: a kind found by its entry point reads its own settings (a bad
one is one line naming its key), an unknown kind is one line naming the installed ones, a
broken registration is refused in one line, the built-in kinds come from this project's own
``pyproject.toml`` when it runs from a checkout, and reading the registry imports no SDK."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

import maple_acp
from maple_acp.backends import ProviderUnavailable, build_backend, load_provider_config
from maple_acp.backends._probe import check_provider
from maple_acp.backends.provider import (
    ENTRY_POINT_GROUP,
    BuiltEngine,
    EngineKind,
    EngineKinds,
    EngineOptions,
    ProviderConfig,
    ProviderConfigError,
    ProviderKeys,
    Registration,
    SettingError,
    installed_kinds,
)
from maple_acp.backends.provider._kinds import checkout_registrations, installed_registrations
from maple_acp.runtime import Backend, Turn, warm_up_quietly

CHECKOUT = Path(maple_acp.__file__).resolve().parents[1]


class RegionBackend(Backend):
    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    async def run_turn(self, turn: Turn) -> None:
        await turn.send_text("ok")


class RegionKind(EngineKind):
    """A kind with settings of its own: a required region and an optional profile table."""

    name = "regional"
    title = "Regional"

    def settings(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(extra) - {"region", "profile"})
        if unknown:
            raise SettingError(unknown[0], "is not a regional setting (region, profile)")
        region = extra.get("region")
        if region not in ("north", "south"):
            raise SettingError("region", "must be 'north' or 'south'")
        profile = extra.get("profile", {})
        if not isinstance(profile, Mapping) or not isinstance(profile.get("name", ""), str):
            raise SettingError("profile.name", "must be a string")
        return {"region": region, "profile": dict(profile)}

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        return BuiltEngine(RegionBackend(config))


class NotAKind:
    name = "odd"


class FailingSettings(RegionKind):
    name = "failing"

    def settings(self, extra: Mapping[str, Any]) -> Any:
        raise TypeError("a bug in the kind")


class NeedsKind(RegionKind):
    name = "needs"
    title = "Needy"
    requires = ("no_such_package_for_maple",)
    install = "pip install needy-engine"


REGIONAL = RegionKind()


def registry(*extra: Registration) -> EngineKinds:
    return EngineKinds(
        [
            *installed_registrations(),
            Registration("regional", f"{__name__}:REGIONAL", "regional-engine"),
            *extra,
        ]
    )


def raw(**provider: Any) -> dict[str, Any]:
    return {
        "providers": [
            {"name": "p", "base_url": "https://api.example.invalid/v1", "models": ["m"], **provider}
        ]
    }


def test_a_kind_reads_its_own_settings_which_the_foundation_does_not_know() -> None:
    config = load_provider_config(
        raw(kind="regional", region="north", profile={"name": "work"}), "f", kinds=registry()
    )
    (entry,) = config.providers
    assert entry.kind == "regional"
    assert entry.kind_settings == {"region": "north", "profile": {"name": "work"}}
    backend, _ = build_backend(config, {}, kinds=registry())
    assert isinstance(backend, RegionBackend)
    assert backend.config is config


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, "f: providers[0].region: must be 'north' or 'south'"),
        ({"region": "east"}, "f: providers[0].region: must be 'north' or 'south'"),
        (
            {"region": "north", "profile": {"name": 3}},
            "f: providers[0].profile.name: must be a string",
        ),
        (
            {"region": "north", "zone": "a"},
            "f: providers[0].zone: is not a regional setting (region, profile)",
        ),
    ],
)
def test_a_bad_setting_of_a_kind_is_one_line_naming_its_key(
    settings: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(kind="regional", **settings), "f", kinds=registry())
    assert str(caught.value) == expected


def test_a_built_in_kind_has_no_settings_of_its_own() -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(region="north"), "f")
    assert str(caught.value) == "f: providers[0].region: is not a provider setting"


def test_an_unknown_kind_names_the_installed_ones() -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(kind="bedrock"), "f", kinds=registry())
    assert str(caught.value) == (
        "f: providers[0].kind: 'bedrock' is not an installed engine kind (installed: "
        "'anthropic', 'openai', 'regional'); install the package that provides it"
    )
    # A configuration made by hand is refused by the build the same way.
    config = load_provider_config(raw(kind="regional", region="north"), "f", kinds=registry())
    with pytest.raises(ProviderConfigError, match=r"^f: providers\[0\]\.kind: 'regional' is not"):
        build_backend(config, {})


@pytest.mark.parametrize(
    ("registration", "expected"),
    [
        (
            Registration("gone", "no_such_module_anywhere:KIND", "gone-engine"),
            "f: providers[0].kind: the engine kind 'gone' (gone-engine: "
            "no_such_module_anywhere:KIND) could not be loaded: ModuleNotFoundError: No module "
            "named 'no_such_module_anywhere'",
        ),
        (
            Registration("odd", f"{__name__}:NotAKind", "odd-engine"),
            f"f: providers[0].kind: the engine kind 'odd' (odd-engine: {__name__}:NotAKind) is "
            "not an EngineKind",
        ),
        (
            Registration("alias", f"{__name__}:REGIONAL", "alias-engine"),
            f"f: providers[0].kind: the engine kind 'alias' (alias-engine: {__name__}:REGIONAL) "
            "calls itself 'regional'",
        ),
    ],
)
def test_a_broken_registration_is_one_line(registration: Registration, expected: str) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(kind=registration.name), "f", kinds=registry(registration))
    assert str(caught.value) == expected


def test_a_kind_registered_twice_is_refused_naming_both() -> None:
    twice = registry(Registration("regional", f"{__name__}:FailingSettings", "other-engine"))
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(kind="regional", region="north"), "f", kinds=twice)
    assert str(caught.value) == (
        f"f: providers[0].kind: 'regional' is registered twice, by regional-engine "
        f"({__name__}:REGIONAL) and other-engine ({__name__}:FailingSettings)"
    )


def test_a_kind_failing_to_read_its_settings_is_its_failure_not_the_users() -> None:
    kinds = registry(Registration("failing", f"{__name__}:FailingSettings", "failing-engine"))
    with pytest.raises(ProviderConfigError) as caught:
        load_provider_config(raw(kind="failing"), "f", kinds=kinds)
    assert str(caught.value) == (
        "f: providers[0]: the Regional engine failed to read its settings (TypeError)"
    )


def test_a_kind_without_a_model_list_needs_the_models_and_is_not_checked() -> None:
    unlisted = raw(kind="regional", region="south")
    del unlisted["providers"][0]["models"]
    unlisted["default_model"] = "p/m"
    config = load_provider_config(unlisted, "f", kinds=registry())
    with pytest.raises(ProviderConfigError) as caught:
        build_backend(config, {}, kinds=registry())
    assert str(caught.value) == (
        "f: providers[0].models: is required: the Regional engine does not list its models"
    )


async def test_the_start_up_check_of_a_kind_that_lists_no_models_says_so() -> None:
    config = load_provider_config(raw(kind="regional", region="north"), "f", kinds=registry())
    _, catalog = build_backend(config, {}, kinds=registry())
    (check,) = await catalog.check_providers()
    assert check.state == "not checked"
    assert check.ok
    assert check.line() == (
        'provider "p" at https://api.example.invalid: not checked (the regional engine does '
        "not list its models)"
    )


def test_a_missing_package_of_a_kind_names_the_package_and_the_install() -> None:
    kinds = registry(Registration("needs", f"{__name__}:NeedsKind", "needy-engine"))
    config = load_provider_config(raw(kind="needs", region="north"), "f", kinds=kinds)
    with pytest.raises(ProviderUnavailable) as caught:
        build_backend(config, {}, kinds=kinds)
    assert str(caught.value) == (
        "the Needy provider needs the no_such_package_for_maple package: pip install needy-engine"
    )


def test_the_built_in_kinds_are_registered_in_pyproject_and_found_from_a_checkout() -> None:
    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][ENTRY_POINT_GROUP]
    assert set(declared) == {"openai", "anthropic"}
    found = checkout_registrations(CHECKOUT)
    assert found is not None
    assert {(each.name, each.value) for each in found} == set(declared.items())
    # This interpreter's installed metadata may predate the entry points: the checkout's own
    # pyproject.toml stands in, so the built-in kinds are there either way.
    assert {"openai", "anthropic"} <= set(installed_kinds().names())
    assert installed_kinds().get("openai").name == "openai"


def test_a_directory_that_is_not_this_checkout_registers_nothing(tmp_path: Path) -> None:
    assert checkout_registrations(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "other"\n[project.entry-points."maple_acp.engines"]\nx = "a:b"\n'
    )
    assert checkout_registrations(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text("not toml [")
    assert checkout_registrations(tmp_path) is None


def test_reading_the_registry_and_a_configuration_imports_no_sdk() -> None:
    script = """
import sys
import maple_acp.engine
from maple_acp.backends import build_backend, load_provider_config
from maple_acp.backends.provider import installed_kinds

kinds = installed_kinds()
assert {"openai", "anthropic"} <= set(kinds.names()), kinds.names()
for kind in ("openai", "anthropic"):
    config = load_provider_config(
        {"providers": [{"name": "p", "kind": kind, "base_url": "http://127.0.0.1:9/v1",
                        "models": ["m"]}]},
        "f",
    )
    build_backend(config, {})
loaded = sorted(n for n in sys.modules if n.split(".")[0] in ("openai", "anthropic", "httpx2"))
print(loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=CHECKOUT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_check_provider_alone_finds_its_kinds_listing() -> None:
    config = load_provider_config(raw(base_url="http://127.0.0.1:9/v1"), "f")
    check = await check_provider(config, config.providers[0], None, bound_s=2.0)
    assert check.state == "unreachable"


class SleepyBackend(RegionBackend):
    async def warm_up(self) -> None:
        raise RuntimeError("asleep")


class SleepyKind(RegionKind):
    name = "sleepy"

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        return BuiltEngine(SleepyBackend(config))


class WarmBackend(RegionBackend):
    warmed = False

    async def warm_up(self) -> None:
        await trio.lowlevel.checkpoint()
        self.warmed = True

    def thought_levels(self, model_id: str | None) -> tuple[str, ...]:
        return ("hot",) if self.warmed else ()


class WarmKind(RegionKind):
    name = "warm"

    def build(
        self, config: ProviderConfig, keys: ProviderKeys, options: EngineOptions
    ) -> BuiltEngine:
        return BuiltEngine(WarmBackend(config))


async def test_a_kind_failing_to_warm_up_leaves_the_others_warming(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kinds = registry(
        Registration("sleepy", f"{__name__}:SleepyKind", "sleepy-engine"),
        Registration("warm", f"{__name__}:WarmKind", "warm-engine"),
    )
    mixed = {
        "providers": [
            {
                "name": name,
                "kind": name,
                "base_url": "http://127.0.0.1:9/v1",
                "models": ["m"],
                "region": "north",
            }
            for name in ("sleepy", "warm")
        ]
    }
    backend, _ = build_backend(load_provider_config(mixed, "f", kinds=kinds), {}, kinds=kinds)
    async with backend:
        await warm_up_quietly(backend)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "the agent backend could not warm up (RuntimeError)"
    ]
    # The router asks the model's own backend, which did warm up.
    assert tuple(backend.thought_levels("warm/m")) == ("hot",)
    assert tuple(backend.thought_levels("sleepy/m")) == ()


def test_entry_points_on_the_path_are_found_and_a_bad_name_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    info = tmp_path / "parrot_engine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: parrot-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nparrot = {__name__}:REGIONAL\nParrot Two = {__name__}:REGIONAL\n"
    )
    monkeypatch.syspath_prepend(os.fspath(tmp_path))
    found = {(each.name, each.distribution) for each in installed_registrations()}
    assert ("parrot", "parrot-engine") in found
    assert {"openai", "anthropic"} <= {name for name, _ in found}
    assert not [name for name, _ in found if name.startswith("Parrot")]
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring the engine kind 'Parrot Two' of parrot-engine: a kind's name is lower-case "
        "letters, digits, '.', '_' or '-'"
    ]
