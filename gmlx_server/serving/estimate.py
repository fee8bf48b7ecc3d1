"""POST /v1/estimate (and chat's dry_run) and GET /v1/capacity/plan: admission answers before a request.

The dry run never loads a model: a model that is not resident is tokenized with a tokenizer and
template built from its GGUF header alone (no MLX), and answers resident: false. A file that cannot load
gets the load's own answers: 403 for a repo id, 503 model_load_failed for a bad file.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmlx_plan.families import family_of
from gmlx_plan.geometry import DEFAULT_CONTEXT
from gmlx_plan.gguf_header import read_header
from gmlx_server.engine.arch import arch_spec
from gmlx_server.engine.chat_template import JinjaChatTemplate
from gmlx_server.engine.dir_files import is_model_dir, trained_context
from gmlx_server.engine.dir_tokenizer import DirTokenizer, dir_template, read_json
from gmlx_server.engine.tokenizer import GGUFTokenizer
from gmlx_server.engine.types import ChatTemplate, Engine, Tokenizer
from gmlx_server.engine.vision.dir_vision import projector_from_dir, vision_family
from gmlx_server.engine.vision.mmproj import read_projector
from gmlx_server.engine.vision.processor import ImageProcessor
from gmlx_server.generation_params import GenerationParams
from gmlx_server.serving.addressing import Settings, resolve_address, resolve_settings
from gmlx_server.serving.admission import disk_extra_s, paces_of
from gmlx_server.serving.cache_stats import disk_peek
from gmlx_server.serving.generation import check_message_count, fit_tools, render_chat, request_priority, tool_plan
from gmlx_server.serving.hf_policy import local_entry
from gmlx_server.serving.image_fetch import ImagePolicy
from gmlx_server.serving.model_host import ModelHost
from gmlx_server.serving.output_format import compile_format
from gmlx_server.serving.tool_prompt import ToolPlan
from gmlx_server.serving.vision import PromptImages, prompt_images


@dataclass(frozen=True)
class PromptTools:
    family: str
    context_length: int
    tokenizer: Tokenizer
    template: ChatTemplate
    vision: ImageProcessor | None = None  # a vision model's image preprocessing, built from its projector's header


def _dir_tools(path: str, chat_template: str | None, max_kv_size: int | None) -> PromptTools:
    """A model directory's tokenizer, template and image processor, from its files."""
    config = read_json(Path(path) / "config.json")
    family = family_of(str(config.get("model_type", ""))).name
    trained = trained_context(path) or DEFAULT_CONTEXT
    tokenizer = DirTokenizer(path)
    vision = vision_family(config)
    images = ImageProcessor(projector_from_dir(path, config, vision), tokenizer.token_to_id) if vision else None
    return PromptTools(family, min(trained, max_kv_size) if max_kv_size else trained, tokenizer,
                       dir_template(path, family, chat_template), images)


def _header_tools(path: str, chat_template: str | None, max_kv_size: int | None,
                  mmproj: str | None = None) -> PromptTools:
    if is_model_dir(path):
        return _dir_tools(path, chat_template, max_kv_size)
    header = read_header(path)
    family = arch_spec(header).family
    trained = int(header.arch_value("context_length", DEFAULT_CONTEXT))
    tokenizer = GGUFTokenizer.from_metadata(header.metadata)
    vision = ImageProcessor(read_projector(mmproj), tokenizer.token_to_id) if mmproj else None
    return PromptTools(family, min(trained, max_kv_size) if max_kv_size else trained, tokenizer,
                       JinjaChatTemplate.from_metadata(header.metadata, family, chat_template), vision)


@dataclass(frozen=True)
class Rendering:
    """A chat request ready to render without loading its model: the tools, settings and tool plan a
    generation would use, its images prepared. render() and tokenize() block: call them in a thread."""

    model_id: str
    tools: PromptTools
    engine: Engine | None  # the resident engine, None when the tools were built from the header
    settings: Settings
    plan: ToolPlan | None
    inp: GenerationParams
    images: PromptImages | None
    tool_share: float  # the model's tool_prompt_budget: past it the tools render compactly, as a generation's do

    def fit(self) -> tuple[str, list[int], ToolPlan | None]:
        t = self.tools
        return fit_tools(self.inp, self.settings, t.template, t.tokenizer, self.model_id, t.context_length, self.plan,
                         self.images, self.tool_share)

    def render(self) -> str:
        """The prompt text, images still placeholders; the tools as a generation renders them (maybe compactly)."""
        plan = self.fit()[2] if self.plan is not None else None
        return render_chat(self.inp, self.settings, self.tools.template, plan)

    def tokenize(self) -> tuple[str, list[int]]:
        text, ids, _ = self.fit()
        return text, ids


# The wave replay steps through every prompt's prefill chunks on the event loop: a plan that cannot run, or one
# past this many tokens in all, gets no time estimate instead of a replay a hostile width or depth would make endless.
MAX_WAVE_TOKENS = 1 << 24
_NO_WAVE: dict[str, float | None] = {"est_ttft_s": None, "est_drain_s": None}


def _warm(engine: Engine, ids: list[int]) -> tuple[str, int]:
    """The prompt cache's tier and reusable tokens for this prompt; engines without one say miss."""
    return engine.cache_peek(ids)


class Estimator:
    def __init__(self, host: ModelHost) -> None:
        self.host = host
        self._tools: dict[tuple[object, ...], PromptTools] = {}  # keyed by load parameters: a reload refreshes

    async def tools(self, model_id: str) -> tuple[PromptTools, Engine | None]:
        engine = self.host.resident.get(model_id)
        if engine is not None:
            info = engine.info
            return PromptTools(info.family, info.context_length, engine.tokenizer, engine.template, info.vision), engine
        e = self.host.entry(model_id)
        local = local_entry(e, self.host.config)
        await asyncio.to_thread(self.host.files.verify, local)
        key = e.load_key
        if key not in self._tools:
            try:
                self._tools[key] = await asyncio.to_thread(_header_tools, local.path, e.chat_template, e.max_kv_size,
                                                           e.mmproj)
            except (ValueError, KeyError, OSError) as exc:  # what the header check cannot see, or a fake's path
                raise self.host.files.load_failed(local, exc) from exc
        return self._tools[key], None

    async def rendering(self, inp: GenerationParams) -> Rendering:
        """The request's model (addressed as a generation addresses it), tools, settings, tool plan and images."""
        host = self.host
        check_message_count(inp)
        await compile_format(inp.output_format)  # a format that cannot be enforced is the generation's 400
        addr = resolve_address(inp.model, inp.profile, host.catalog)
        tools, engine = await self.tools(addr.model_id)
        settings = resolve_settings(addr, tools.family, host.catalog)
        plan = tool_plan(host, addr.model_id, inp, tools.template)  # the tools' prompt, as a generation has it
        inp, images = await prompt_images(inp, tools.vision, addr.model_id, ImagePolicy.of(host.config.server))
        return Rendering(addr.model_id, tools, engine, settings, plan, inp, images,
                         host.entry(addr.model_id).tool_prompt_budget)

    async def estimate(self, inp: GenerationParams) -> dict[str, Any]:
        host = self.host
        r = await self.rendering(inp)
        # The same render, length guard and tokenization as a generation, off the loop.
        _, ids = await asyncio.to_thread(r.tokenize)
        if r.images is not None:
            r.images.bind(ids)  # the images' slots, as the prompt cache keys them

        model_id, tools, engine = r.model_id, r.tools, r.engine
        prompt, cap = len(ids), inp.max_tokens
        # Off the loop: with the disk tier on, a peek lists its directory and reads new files' headers.
        tier, warm = (await asyncio.to_thread(_warm, engine, ids) if engine is not None
                      else await self._disk_warm(model_id, ids))
        # What est_ttft_s times: a prefix shared with a live request is cached by the time this one starts.
        timed = max(warm, await asyncio.to_thread(engine.expected_warm, ids)) if engine is not None else warm
        need = host.capacity.need(model_id, prompt, cap, warm)
        drained = host.capacity.drained_bytes(model_id)
        free = host.governor.read().available_bytes
        return {
            "model": model_id, "prompt_tokens": prompt,
            "warm_tokens": warm, "cache_tier": tier, "need_bytes": need,
            "fits_now": need <= free if need is not None and free is not None else None,
            "fits_drained": need <= drained if need is not None and drained is not None else None,
            "context_ok": prompt + (cap or 0) <= tools.context_length, "context_limit": tools.context_length,
            "est_ttft_s": self._ttft(model_id, engine, (prompt, timed, cap), tier == "disk" and timed == warm,
                                     request_priority(inp, r.settings)),
            "resident": engine is not None,
        }

    async def _disk_warm(self, model_id: str, ids: list[int]) -> tuple[str, int]:
        """A model that is not resident restores from the disk tier at its load, if anything (its files' headers)."""
        entry = self.host.config.models.get(model_id)
        warm = await asyncio.to_thread(disk_peek, self.host.config, entry, ids) if entry is not None else 0
        return ("disk", warm) if warm else ("miss", 0)

    def _ttft(self, model_id: str, engine: Engine | None, request: tuple[int, int, int | None], disk: bool,
              priority: int) -> float | None:
        """The queue ahead at the request's priority, its (prompt, warm, cap): the warm tokens at the restore pace
        (the disk tier's for a disk hit), the cold ones at the prefill pace of their depth; None before any
        prefill was measured. A model that is not resident has no queue and only its disk tier: the prompt is
        all cold until a disk read was timed."""
        prompt, warm, cap = request
        rates = self.host.telemetry.models.get(model_id)
        if rates is None or rates.prefill_pace is None:
            return None
        if engine is None:
            warm = warm if disk and rates.disk_restore_tok_s_recent else 0
            return round(paces_of(None, rates).prompt_s(prompt, warm) + disk_extra_s(rates, warm), 3)
        return round(self.host.admission.ttft_s(model_id, engine.stats(), prompt, warm, cap, disk, priority), 3)

    def plan(self, width: int, depth: int) -> dict[str, Any]:
        """ok from the capacity table; admit_now from the live state; reason = the first failing condition."""
        host = self.host
        ok, why = host.capacity.plan_ok(width, depth)
        stats = [e.stats() for e in host.resident.values()]
        waiting = sum(s.waiting for s in stats)
        width_cap = host.config.server.decode_batch
        free = sum(max(0, s.decode_batch - s.in_flight) for s in stats) if stats else width_cap
        band = host.governor.band
        if band == "yellow":
            free = min(free, 1)  # a wider fan-out waits for the band to clear
        checks = [
            (ok is not False, why or "the capacity table does not hold this plan"),
            (not host.governor.pressure, f"memory band is {band}"),
            (waiting == 0, f"{waiting} requests are waiting"),
            (free >= width, f"only {free} decode slots are free" + (" (yellow band: one counts)" if band == "yellow"
                                                                   else "")),
        ]
        reason = next((msg for passed, msg in checks if not passed), None)
        wave = self._wave(width, depth) if ok is not False and width * depth <= MAX_WAVE_TOKENS else _NO_WAVE
        return {"width": width, "depth": depth, "ok": ok, "admit_now": reason is None, "reason": reason,
                "band": band, "free_slots": free, "waiting": waiting, **wave}

    def _wave(self, width: int, depth: int) -> dict[str, float | None]:
        """When the last of `width` cold prompts of `depth` tokens sent now would get its first token, and when
        the engine would be empty: the boot model's replay; null until it is resident and has prefilled once."""
        boot = self.host.capacity.boot
        engine = self.host.resident.get(boot.model_id) if boot else None
        rates = self.host.telemetry.models.get(boot.model_id) if boot else None
        if boot is None or engine is None or rates is None or rates.prefill_pace is None:
            return dict(_NO_WAVE)
        r = self.host.admission.wave(boot.model_id, engine.stats(), width, depth)
        return {"est_ttft_s": round(max(r.first_token_s), 3), "est_drain_s": round(r.drain_s, 3)}
