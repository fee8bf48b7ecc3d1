"""Model addressing (an id, an alias, or either with @profile), with hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gmlx_server.config import BUILTIN_INTENTS, SAMPLING_KNOBS, Profile
from gmlx_server.errors import InvalidRequest, ModelNotFound, UnknownProfile
from gmlx_server.serving.addressing import PRIORITY_PROFILES, Address, Catalog, resolve_address, resolve_settings
from gmlx_server.serving.intents import SAMPLING_TABLE, table_family

names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
USER = {"qwen-coder": Profile("qwen-coder", intent="coding", sampling={"temperature": 0.25}, max_tokens=99)}


def cat(ids: tuple[str, ...] = ("m",), **kw: object) -> Catalog:
    return Catalog(model_ids=ids, profiles=kw.pop("profiles", USER), **kw)  # type: ignore[arg-type]


@given(mid=names, prof=st.sampled_from([*BUILTIN_INTENTS, *USER]))
def test_id_at_known_profile_splits_on_the_last_at(mid: str, prof: str) -> None:
    assume(not mid.endswith("@" + prof))
    c = cat((mid,))
    assert resolve_address(f"{mid}@{prof}", None, c) == Address(mid, prof)


@given(mid=names, suffix=names)
def test_an_id_containing_at_stays_intact(mid: str, suffix: str) -> None:
    whole = f"{mid}@{suffix}"
    c = cat((whole,))
    assert resolve_address(whole, None, c) == Address(whole)  # even when the suffix names a profile


@given(mid=names, suffix=names)
def test_unknown_suffix_means_the_whole_string_is_the_id(mid: str, suffix: str) -> None:
    assume(suffix not in BUILTIN_INTENTS and suffix not in USER and "@" not in suffix)
    c = cat((mid,))
    with pytest.raises(ModelNotFound) as e:
        resolve_address(f"{mid}@{suffix}", None, c)
    assert e.value.extra["available_models"] == [mid] and e.value.status == 404


@given(alias=names, prof=st.sampled_from([None, *BUILTIN_INTENTS, *USER]))
def test_aliases_to_ids_and_profiles(alias: str, prof: str | None) -> None:
    assume(alias != "m" and "@" not in alias)
    target = "m" if prof is None else f"m@{prof}"
    c = cat(("m",), aliases={alias: target})
    assert resolve_address(alias, None, c) == Address("m", prof, alias)
    # the profile field beats the alias's profile; a suffix on the alias does too
    assert resolve_address(alias, "precise", c).profile == "precise"
    assert resolve_address(f"{alias}@creative", None, c).profile == "creative"


@given(ids=st.lists(names, min_size=1, max_size=4, unique=True), default=st.booleans())
def test_empty_model(ids: list[str], default: bool) -> None:
    c = cat(tuple(ids), default_model=ids[-1] if default else None)
    if default or len(ids) == 1:
        assert resolve_address("", None, c).model_id == ids[-1]
        assert resolve_address(None, None, c).model_id == ids[-1]
    else:
        with pytest.raises(InvalidRequest):
            resolve_address("", None, c)


@given(prof=names)
def test_unknown_profile_field_lists_valid_ones(prof: str) -> None:
    assume(prof not in BUILTIN_INTENTS and prof not in USER and prof not in PRIORITY_PROFILES)
    with pytest.raises(UnknownProfile) as e:
        resolve_address("m", prof, cat())
    assert e.value.extra["valid_profiles"] == sorted([*BUILTIN_INTENTS, *USER, *PRIORITY_PROFILES])


def test_at_profile_alone_addresses_the_default() -> None:
    assert resolve_address("@coding", None, cat(("a",))) == Address("a", "coding")


def test_settings_layering() -> None:
    c = cat(("m",), model_profiles={"m": "creative"})
    assert resolve_settings(Address("m"), "qwen3", c).sampling == dict(
        SAMPLING_TABLE["qwen"]["base"], **SAMPLING_TABLE["qwen"]["creative"])
    s = resolve_settings(Address("m", "qwen-coder"), "qwen3", c)  # inline profile overrides model.profile
    assert s.sampling["temperature"] == 0.25 and s.sampling["top_k"] == 20 and s.max_tokens == 99
    assert resolve_settings(Address("m"), "llama", cat()).sampling == SAMPLING_TABLE["llama"]["base"]


@pytest.mark.parametrize("family, row", [("qwen2", "qwen"), ("gemma3_text", "gemma"), ("llama", "llama"),
                                         ("mistral3", "mistral"), ("phi3", "default")])
def test_family_rows(family: str, row: str) -> None:
    assert table_family(family) == row
    assert set(SAMPLING_TABLE[row]) == {"base", *BUILTIN_INTENTS}


def test_every_intent_sets_knobs_within_their_ranges() -> None:
    """The family presets are values a profile or a request could send (config/sampling.py's table)."""
    for intents in SAMPLING_TABLE.values():
        for preset in intents.values():
            assert all(SAMPLING_KNOBS[k].admits(v) for k, v in preset.items()), preset


def test_priority_profiles_and_a_profiles_priority() -> None:
    from gmlx_server.config import Profile
    from gmlx_server.serving.addressing import Catalog, resolve_address, resolve_settings

    cat = Catalog.from_config(make_priority_config(Profile("bulk", priority=5)))
    side = resolve_settings(resolve_address("m1@batch", None, cat), "llama", cat)
    assert side.priority == 10 and side.profile == "batch" and side.sampling == resolve_settings(
        resolve_address("m1", None, cat), "llama", cat).sampling  # the model's defaults, at batch priority
    assert resolve_settings(resolve_address("m1@interactive", None, cat), "llama", cat).priority == -10
    assert resolve_settings(resolve_address("m1@bulk", None, cat), "llama", cat).priority == 5
    assert resolve_settings(resolve_address("m1", None, cat), "llama", cat).priority is None
    assert {"batch", "interactive", "bulk"} <= set(cat.valid_profiles)


def make_priority_config(*profiles: object) -> object:
    from types import MappingProxyType

    from gmlx_server.config import ModelEntry, ServerConfig, ServerSettings

    return ServerConfig(ServerSettings(default_model="m1"), MappingProxyType({"m1": ModelEntry("m1", "/x.gguf")}),
                        MappingProxyType({p.name: p for p in profiles}))  # type: ignore[attr-defined]
