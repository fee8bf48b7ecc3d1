"""Model addressing (an id, an alias, or either with @profile): pure functions, no I/O.

`id`, `id@profile` (split on the last @, only when the suffix names a known profile), aliases
(to `id` or `id@profile`), the `profile` field, and the layering of sampling values:
family base < profile (or model.profile) < explicit request fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gmlx_server.config import BUILTIN_INTENTS, PRIORITIES, Profile, ServerConfig
from gmlx_server.errors import InvalidRequest, ModelNotFound, UnknownProfile, clip
from gmlx_server.serving.intents import family_sampling

# model@batch and model@interactive: the model's defaults at that priority (agents' side calls, a chat window)
PRIORITY_PROFILES = ("batch", "interactive")


@dataclass(frozen=True)
class Catalog:
    """What addressing needs from the config: ids, aliases, profiles, the default."""

    model_ids: tuple[str, ...]
    default_model: str | None = None
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    model_profiles: Mapping[str, str | None] = field(default_factory=dict)  # model.profile per id
    clamped: frozenset[str] = frozenset()  # ids whose oversized max_tokens is lowered rather than refused

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> Catalog:
        return cls(
            model_ids=tuple(cfg.models),
            default_model=cfg.server.default_model,
            profiles=cfg.profiles,
            aliases=cfg.aliases,
            model_profiles=MappingProxyType({m.id: m.profile for m in cfg.models.values()}),
            clamped=frozenset(m.id for m in cfg.models.values()
                              if (cfg.server.clamp_max_tokens if m.clamp_max_tokens is None else m.clamp_max_tokens)),
        )

    @property
    def valid_profiles(self) -> list[str]:
        return sorted(set(self.profiles) | set(BUILTIN_INTENTS) | set(PRIORITY_PROFILES))

    def is_profile(self, name: str) -> bool:
        return name in self.profiles or name in BUILTIN_INTENTS or name in PRIORITY_PROFILES


@dataclass(frozen=True)
class Address:
    model_id: str
    profile: str | None = None  # the profile the request names; None = model.profile, else family base
    alias: str | None = None


def _lookup(name: str, cat: Catalog) -> Address | None:
    """An exact id or alias; an exact id wins, so an id containing @ is never split."""
    if name in cat.model_ids:
        return Address(name)
    target = cat.aliases.get(name)
    if target is None:
        return None
    if target in cat.model_ids:
        return Address(target, alias=name)
    mid, _, prof = target.rpartition("@")
    return Address(mid, prof or None, alias=name)


def _default(cat: Catalog) -> Address:
    if cat.default_model is not None:
        hit = _lookup(cat.default_model, cat)
        if hit is not None:
            return hit
    if len(cat.model_ids) == 1:
        return Address(cat.model_ids[0])
    raise InvalidRequest(
        f"model is required: this server has {len(cat.model_ids)} models and no default "
        f"(available: {', '.join(cat.model_ids)})",
        param="model",
    )


def _split(name: str, cat: Catalog) -> Address:
    head, sep, tail = name.rpartition("@")
    if sep and cat.is_profile(tail):
        base = _default(cat) if head == "" else _lookup(head, cat)
        if base is None:
            raise ModelNotFound(head, cat.model_ids)
        return Address(base.model_id, tail, base.alias)
    err = ModelNotFound(name, cat.model_ids)
    if sep and head and _lookup(head, cat) is not None:
        # The whole string is the id (an id may contain @), but the likelier mistake is the profile name: say so.
        err.message += f" ('{clip(tail)}' is not a profile either; valid profiles: {', '.join(cat.valid_profiles)})"
        err.args = (err.message,)
    raise err


def resolve_address(model: str | None, profile: str | None, cat: Catalog) -> Address:
    """The request's model string and `profile` field -> model id + profile name (raises typed errors)."""
    name = model or ""
    addr = _default(cat) if name == "" else (_lookup(name, cat) or _split(name, cat))
    if profile:
        if not cat.is_profile(profile):
            raise UnknownProfile(profile, cat.valid_profiles)
        addr = Address(addr.model_id, profile, addr.alias)  # the explicit field beats a suffix or alias
    return addr


@dataclass(frozen=True)
class Settings:
    """Resolved defaults for one request before its explicit fields are applied."""

    sampling: dict[str, Any]
    max_tokens: int | None = None
    system: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None  # the profile that applied, if any
    stop: tuple[str, ...] = ()
    priority: int | None = None  # the profile's, for requests that name none


def resolve_settings(addr: Address, family: str, cat: Catalog) -> Settings:
    """Family base < the named profile, else model.profile. A user profile starts from its intent."""
    name = addr.profile or cat.model_profiles.get(addr.model_id)
    if name is None:
        return Settings(family_sampling(family, None))
    user = cat.profiles.get(name)
    if user is None and name in PRIORITY_PROFILES:  # model@batch: the family's defaults at that priority
        return Settings(family_sampling(family, None), profile=name, priority=PRIORITIES[name])
    if user is None:  # a built-in intent
        return Settings(family_sampling(family, name), profile=name)
    sampling = family_sampling(family, user.intent)
    sampling.update(user.sampling)
    return Settings(sampling, user.max_tokens, user.system, dict(user.chat_template_kwargs), name, user.stop,
                    user.priority)


def merge_sampling(settings: Settings, explicit: Mapping[str, Any]) -> dict[str, Any]:
    """Explicit request fields always win over profile values."""
    merged = dict(settings.sampling)
    merged.update(explicit)
    return merged
