"""Sampler: batched token choice on the device.

Per step the engine builds one SamplingBatch (per-row settings as tensors), then:
penalties → grammar masks → (greedy rows: argmax) → temperature → top-k → top-p → min-p →
exponential race.
The race (argmax of p / Exp(1) noise) samples from p; a seeded request draws its noise from its
own generator, so its tokens do not depend on which other requests share the batch.
Logprobs are those of the raw model distribution (vLLM's default), before penalties/temperature.
The logits come in float32 or, at serving batches, in the model's dtype (bf16): the plain paths
(argmax, the fused temperature race, grammar masks) read them so, the others widen them first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from osserve.engine.core.outputs import TokenLogprob
from osserve.engine.core.sampling_params import SamplingParams
from osserve.ops.dispatch import use_triton
from osserve.ops.sampling.dispatch import apply_token_bitmask


@dataclass
class Penalties:
    repetition: torch.Tensor  # [B]
    frequency: torch.Tensor  # [B]
    presence: torch.Tensor  # [B]
    output_counts: torch.Tensor  # [B, V] counts of each generated token
    seen: torch.Tensor  # [B, V] bool: token in prompt or output (repetition penalty)


def _to_device(vals: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:  # type: ignore[type-arg]
    host = torch.tensor(vals, dtype=dtype)
    # Pinned: a copy from pageable memory would make the host wait for the GPU's queue.
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


@dataclass
class RowSettings:
    """The settings of a batch's rows that depend on its requests alone, not on their tokens so far.
    A tensor is built only when some row needs it (each costs a pass over the rows, a pinned copy
    and a launch): a batch of greedy rows builds none. Kept while the same requests sample in the
    same order (most steps of a steady decode), so such a step builds nothing."""

    params: list[SamplingParams]  # the rows' own objects, held: reuse is decided by identity
    temperature: torch.Tensor | None  # [B] float32; 0 marks greedy rows. None: every row is greedy
    top_k: torch.Tensor | None  # [B] int64; vocab size where disabled. None: no row limits it
    top_p: torch.Tensor | None  # [B] float32. None: every row keeps 1.0
    min_p: torch.Tensor | None  # [B] float32. None: every row has 0
    num_logprobs: int | None  # most top logprobs any row asked for
    penalized: bool  # some row has a penalty (its counts are built each step)
    scripted: list[int]  # rows with stop ids banned up to min_tokens or forced tokens: looked at each step

    @classmethod
    def build(cls, params: list[SamplingParams], device: torch.device, vocab_size: int) -> RowSettings:
        greedy = all(p.temperature == 0.0 for p in params)
        any_top_k = any(0 < p.top_k < vocab_size for p in params)
        any_top_p = any(p.top_p < 1.0 for p in params)
        any_min_p = any(p.min_p > 0.0 for p in params)
        wanted = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            params=list(params),
            temperature=None if greedy else _to_device([p.temperature for p in params], torch.float32, device),
            top_k=_to_device([p.top_k if p.top_k > 0 else vocab_size for p in params], torch.int64, device)
            if any_top_k else None,
            top_p=_to_device([p.top_p for p in params], torch.float32, device) if any_top_p else None,
            min_p=_to_device([p.min_p for p in params], torch.float32, device) if any_min_p else None,
            num_logprobs=max(wanted) if wanted else None,
            penalized=any(p.penalized for p in params),
            scripted=[i for i, p in enumerate(params)
                      if p.min_tokens > 0 and p.stop_token_ids or p.forced_token_ids is not None],
        )

    def holds(self, params: list[SamplingParams]) -> bool:
        """Whether these are the settings of exactly these rows (the same requests, in order)."""
        mine = self.params
        return len(mine) == len(params) and all(a is b for a, b in zip(mine, params, strict=True))


@dataclass
class SamplingBatch:
    """One step's rows: their settings (RowSettings) and what depends on their tokens so far."""

    settings: RowSettings
    penalties: Penalties | None  # None: no row has a penalty
    mask_stop: dict[int, list[int]]  # row -> stop ids banned until its min_tokens are out
    forced: dict[int, int]  # row -> the scripted token it emits this step
    generators: list[torch.Generator | None]
    mask_rows: torch.Tensor | None = None  # [R] int64: rows whose grammar constrains them (structured/)
    mask_bits: torch.Tensor | None = None  # [R, V/32] int32: their allowed tokens, a bit each

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        prompt_ids: list[list[int]],
        output_ids: list[list[int]],
        generators: list[torch.Generator | None],
        device: torch.device,
        vocab_size: int = 201088,
        token_masks: tuple[torch.Tensor, torch.Tensor] | None = None,
        settings: RowSettings | None = None,
    ) -> SamplingBatch:
        """token_masks: (rows, their mask words), on the device already (MaskUpload). settings: the
        last step's, reused where they hold these rows (the batch's `settings` are the ones to keep)."""
        if settings is None or not settings.holds(params):
            settings = RowSettings.build(params, device, vocab_size)
        mask_stop, forced = {}, {}
        for i in settings.scripted:
            p, done = params[i], len(output_ids[i])
            if done < p.min_tokens and p.stop_token_ids:
                mask_stop[i] = list(p.stop_token_ids)
            if (f := p.forced_token_ids) is not None and done < len(f):
                forced[i] = f[done]
        return cls(
            settings=settings,
            penalties=_penalties(params, prompt_ids, output_ids, device, vocab_size) if settings.penalized else None,
            mask_stop=mask_stop,
            forced=forced,
            generators=generators,
            mask_rows=token_masks[0] if token_masks else None,
            mask_bits=token_masks[1] if token_masks else None,
        )


def _penalties(
    params: list[SamplingParams], prompt_ids: list[list[int]], output_ids: list[list[int]], device: torch.device,
    vocab_size: int,
) -> Penalties:
    b = len(params)
    counts = torch.zeros(b, vocab_size, dtype=torch.float32, device=device)
    seen = torch.zeros(b, vocab_size, dtype=torch.bool, device=device)
    for i, (pr, out) in enumerate(zip(prompt_ids, output_ids, strict=True)):
        if out:
            o = torch.tensor(out, device=device)
            counts[i].index_add_(0, o, torch.ones(len(out), device=device))
        seen[i, torch.tensor(pr + out, dtype=torch.long, device=device)] = True
    return Penalties(
        repetition=_to_device([p.repetition_penalty for p in params], torch.float32, device),
        frequency=_to_device([p.frequency_penalty for p in params], torch.float32, device),
        presence=_to_device([p.presence_penalty for p in params], torch.float32, device),
        output_counts=counts, seen=seen,
    )


class MaskUpload:
    """A step's grammar masks (a 32-bit word per 32 tokens: 6.4 MB at 256 rows of gpt-oss's vocabulary)
    copied to the device on a stream of their own. On the compute stream the copy would wait behind
    the step's forward, launched before the masks were filled, and the sampling behind the copy; on
    its own stream it overlaps the forward, and the sampling waits for it alone. The device buffer is
    reused: the step before's sampling, its last reader, is waited for (an event) before it is
    overwritten (the engine has that step's tokens on the host by then: no wait in practice)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.bits = torch.empty(0, 0, dtype=torch.int32, device=device)
        self.read: torch.cuda.Event | None = None  # recorded after the last sampling that read `bits`

    def upload(self, rows: list[int], bits: torch.Tensor | list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows int64, bits [R, W] int32) on the device, for SamplingBatch.build's token_masks.
        bits: host memory (pinned on a GPU) that stays untouched until the step's tokens are read;
        one tensor, or consecutive parts of the rows (structured.matchers.MaskBits), copied one
        after another into the device's rows."""
        parts = bits if isinstance(bits, list) else [bits]
        if self.stream is None:
            return _to_device(rows, torch.int64, self.device), torch.cat(parts).to(self.device)
        n, words = sum(p.shape[0] for p in parts), parts[0].shape[1]
        compute = torch.cuda.current_stream(self.device)
        fresh = self.bits.shape[0] < n or self.bits.shape[1] != words
        if fresh:  # allocated on the compute stream: its memory may still be in use by work queued there
            self.bits = torch.empty(max(n, 2 * self.bits.shape[0]), words, dtype=torch.int32, device=self.device)
        with torch.cuda.stream(self.stream):
            if fresh:
                self.stream.wait_stream(compute)
            elif self.read is not None:
                self.stream.wait_event(self.read)
            device_bits = self.bits[:n]
            start = 0
            for part in parts:
                device_bits[start:start + part.shape[0]].copy_(part, non_blocking=True)
                start += part.shape[0]
            device_rows = _to_device(rows, torch.int64, self.device)
        compute.wait_stream(self.stream)
        device_rows.record_stream(compute)  # allocated on the copy stream, read on the compute one
        return device_rows, device_bits

    def sampled(self) -> None:
        """Mark that the sampling launched since the last upload is the buffer's last reader so far."""
        if self.stream is not None:
            self.read = torch.cuda.Event()
            self.read.record(torch.cuda.current_stream(self.device))


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] logprob of the chosen token
    top_token_ids: torch.Tensor | None  # [B, K]
    top_logprobs: torch.Tensor | None  # [B, K]

    def token_logprobs(self, wanted: list[int | None]) -> list[TokenLogprob | None]:
        """Per sampled row, its TokenLogprob (the top `wanted[i]` alternatives) when its request asked for
        logprobs, else None: the host copy the engine hands to the output processor."""
        if self.logprobs is None or all(k is None for k in wanted):
            return [None] * len(wanted)
        chosen = self.token_ids.tolist()
        lps = self.logprobs.tolist()
        top_ids = self.top_token_ids.tolist() if self.top_token_ids is not None else None
        top_lps = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        rows: list[TokenLogprob | None] = []
        for i, k in enumerate(wanted):
            if k is None:
                rows.append(None)
                continue
            top = list(zip(top_ids[i][:k], top_lps[i][:k], strict=True)) if top_ids and top_lps else []
            rows.append(TokenLogprob(chosen[i], lps[i], top))
        return rows


def apply_penalties(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Repetition (vLLM: positive logits divided, negative multiplied, for seen tokens), then
    frequency and presence (OpenAI: subtract count*f + [count>0]*p over generated tokens)."""
    pen = b.penalties
    if pen is None:
        return logits
    rep = pen.repetition[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(pen.seen, penalised, logits)
    logits = logits - pen.frequency[:, None] * pen.output_counts
    return logits - pen.presence[:, None] * (pen.output_counts > 0).float()


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) all but each row's top_k tokens and its smallest nucleus of mass top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
        mask |= ranks >= top_k[:, None]
    if top_p is not None:
        probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly better tokens
        mask |= mass_before >= top_p[:, None]
        mask[:, 0] = False  # always keep the best token
    return logits.scatter(-1, order, sorted_logits.masked_fill(mask, float("-inf")))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(-1)
    threshold = min_p[:, None] * probs.amax(-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


class Sampler:
    @staticmethod
    def _seeds(generators: list[torch.Generator | None], device: torch.device) -> torch.Tensor:
        """A noise seed per row, drawn on the device: from the request's own generator where it has
        one (its tokens then depend on its seed alone, not on the batch), else from the global one."""
        seeds = torch.randint(0, 2**62, (len(generators),), device=device)
        for row, g in enumerate(generators):
            if g is not None:
                seeds[row] = torch.randint(0, 2**62, (1,), device=device, generator=g)[0]
        return seeds

    @torch.inference_mode()  # the runner's logits are inference tensors: masks write them in place
    def sample(self, logits: torch.Tensor, b: SamplingBatch, greedy: torch.Tensor | None = None) -> SamplerOutput:
        """greedy: logits.argmax(-1) where the runner computed it with the logits (ops/linear/head_triton.py);
        used where every row is greedy and nothing changes the logits before the choice."""
        settings = b.settings
        # The logits may be in the model's dtype (GptOssForCausalLM.compute_logits_and_greedy): argmax,
        # the fused race and the masks read them as they are, exactly; the other paths widen them.
        fused = use_triton(logits) and settings.temperature is not None and (
            settings.top_k is None and settings.top_p is None and settings.min_p is None)
        if b.penalties is not None or not (settings.temperature is None or fused):
            logits = logits.float()
        raw = logits
        for row, ids in b.mask_stop.items():
            logits = logits.clone() if logits is raw else logits
            logits[row, ids] = float("-inf")
        logits = apply_penalties(logits, b)
        masked = b.mask_rows is not None and b.mask_bits is not None
        if b.mask_rows is not None and b.mask_bits is not None:
            # In place where nothing reads the raw logits after: the runner's buffer is this step's alone.
            logits = logits.clone() if logits is raw and settings.num_logprobs is not None else logits
            apply_token_bitmask(logits, b.mask_rows, b.mask_bits)
        if settings.temperature is None:  # every row is greedy
            chosen = greedy if greedy is not None and logits is raw and not masked else logits.argmax(-1)
        elif fused:
            # Plain temperature sampling (the default): one fused pass (ops/sampling/gumbel_triton.py).
            from osserve.ops.sampling.gumbel_triton import gumbel_argmax_triton

            chosen = gumbel_argmax_triton(logits, settings.temperature, self._seeds(b.generators, logits.device))
        else:
            greedy = logits.argmax(-1)
            temp = torch.where(settings.temperature > 0, settings.temperature, torch.ones_like(settings.temperature))
            scaled = logits / temp[:, None]
            if settings.top_k is not None or settings.top_p is not None:
                scaled = apply_top_k_top_p(scaled, settings.top_k, settings.top_p)
            if settings.min_p is not None:
                scaled = apply_min_p(scaled, settings.min_p)
            probs = scaled.softmax(-1)
            noise = torch.empty_like(probs).exponential_()
            for row, g in enumerate(b.generators):
                if g is not None:  # the request's own stream: independent of the batch
                    noise[row] = torch.empty_like(probs[row]).exponential_(generator=g)
            sampled = (probs / noise).argmax(-1)
            chosen = torch.where(settings.temperature > 0, sampled, greedy)
        if b.forced:
            forced = torch.tensor([b.forced.get(row, -1) for row in range(len(chosen))], device=chosen.device)
            chosen = torch.where(forced >= 0, forced, chosen)
        if settings.num_logprobs is None:
            return SamplerOutput(chosen, None, None, None)
        logp = raw.float().log_softmax(-1)
        top_lp, top_ids = logp.topk(max(settings.num_logprobs, 1), dim=-1)
        return SamplerOutput(chosen, logp.gather(-1, chosen[:, None])[:, 0], top_ids, top_lp)
