"""Training the built-in model's EAGLE3 draft: `python -m osserve.demo.train_draft --out FILE [--seed 0]
[--steps N]`.

SpecForge's recipe at the demo's size. The demo model (the shipped compact checkpoint, experts
dequantised) runs over the demo corpus without gradients; its layers' outputs (DRAFT_LAYERS) and
its next-token distributions are the draft's inputs and targets. The draft is model/eagle3.py's
layer, trained with "training-time test" (EAGLE-3): step 1 reads the target's states; steps 2..TTT
read the draft's own states of the step before, one position further, and attend to step 1's keys
up to their row and to their own earlier steps' keys at that row only, which is what a chain of
draft steps sees at serving time. Each step's loss is the cross-entropy against the target's
distribution over the draft vocabulary (the tokens the corpus uses, mapped back by d2t), on the
completion's tokens, weighted 0.8 ** step. The head starts as the target's.

It runs on a CPU in minutes (the demo model is small): BENCHMARKS.md and README.md say how the
shipped draft was made and what acceptance length it reaches; scripts/train_draft_gpu.sh runs it
on the lent GPU.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from osserve.config import YarnRope
from osserve.demo.compact import corpus_version
from osserve.demo.corpus import draw_examples, tokenize
from osserve.demo.draft_compact import save_draft
from osserve.demo.trainable import DEMO_CONFIG, DemoTrainable, trainable_from_compact
from osserve.demo.weights import DEMO_WEIGHTS
from osserve.model.eagle3 import Eagle3Config, Eagle3Draft
from osserve.ops.norm.reference import rms_norm_reference as rms
from osserve.ops.rope.reference import apply_rope, rope_cos_sin, yarn_inv_freq

DRAFT_LAYERS = (1, 2, 3)  # of the demo model's 4: its outputs after the second, third and last layers
TTT_DECAY = 0.8


@dataclass
class DraftTrainConfig:
    out: str
    seed: int = 0
    steps: int = 1200
    batch_size: int = 24
    examples: int = 1500
    lr: float = 2e-3
    warmup: int = 50
    ttt: int = 3
    intermediate_size: int = 768
    max_seconds: float | None = None
    device: str = "cuda" if torch.cuda.is_available() else "cpu"


def draft_config(vocab: list[int], intermediate_size: int) -> Eagle3Config:
    c = DEMO_CONFIG
    return Eagle3Config(hidden_size=c.hidden_size, intermediate_size=intermediate_size,
                        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                        head_dim=c.head_dim, vocab_size=c.vocab_size, draft_vocab_size=len(vocab),
                        aux_layer_ids=DRAFT_LAYERS, rms_norm_eps=c.rms_norm_eps,
                        rope=YarnRope(theta=10000.0, factor=1.0))


class DraftTrainer:
    """The draft's parameters (an Eagle3Draft over compact ids: draft id i is target token vocab[i])
    and its dense training-time-test forward."""

    def __init__(self, target: DemoTrainable, cfg: DraftTrainConfig) -> None:
        self.target = target
        self.ttt = cfg.ttt
        self.cfg = draft_config(target.vocab, cfg.intermediate_size)
        self.draft = Eagle3Draft(self.cfg).to(cfg.device)
        g = torch.Generator().manual_seed(cfg.seed)
        with torch.no_grad():
            for name, p in self.draft.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    std = 0.02 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=g) * std)
            assert self.draft.lm_head is not None and self.draft.d2t is not None
            self.draft.lm_head.weight.copy_(target.net.lm_head.weight)
            self.draft.norm.weight.copy_(target.net.model.norm.weight)
            vocab = torch.tensor(target.vocab)
            self.draft.d2t.copy_(vocab - torch.arange(len(vocab)))
        inv_freq, conc = yarn_inv_freq(self.cfg.rope, self.cfg.head_dim)
        self.cos, self.sin = rope_cos_sin(torch.arange(4096, device=cfg.device), inv_freq.to(cfg.device), conc)
        self.embedding = target.net.model.embed_tokens.weight  # compact rows, frozen

    @torch.no_grad()
    def target_states(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the target's chosen layer outputs [B, S, 3H], its next-token probabilities over the
        corpus tokens [B, S, V])."""
        outs: list[torch.Tensor] = []
        final, _ = self.target(ids, outs)
        aux = torch.cat([outs[i] for i in DRAFT_LAYERS], dim=-1)
        return aux, self.target.net.lm_head(final).softmax(-1)

    def loss(self, batch: Batch, keep: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, list[float]]:
        """The TTT loss of a batch, and each step's top-1 agreement with the target (`keep`: a list
        to append each step's log-probabilities [B, C, V] to). Every position gives step 1 its keys;
        only the completion's rows are queried (the loss is there), so the prompt costs fc and the
        k/v projections alone."""
        cfg, layer, d = self.cfg, self.draft.midlayer, self.draft
        assert d.fc is not None and d.lm_head is not None
        ids, rows = batch.ids, batch.rows  # [B, S], [B, C] positions of the completion rows
        b, s = ids.shape
        eps, heads, kv_heads, dim = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        attn, mlp = layer.self_attn, layer.mlp
        hidden_all = F.linear(batch.aux.float(), d.fc.weight)  # [B, S, H]
        x_all = torch.cat([rms(self.embedding[F.pad(ids[:, 1:], (0, 1))], layer.input_layernorm.weight, eps),
                           rms(hidden_all, layer.hidden_norm.weight, eps)], dim=-1)
        pos = torch.arange(s, device=ids.device)
        k1 = rotate(F.linear(x_all, attn.k_proj.weight).view(b, s, kv_heads, dim), pos, self.cos, self.sin)
        v1 = F.linear(x_all, attn.v_proj.weight).view(b, s, kv_heads, dim)
        keys, values = [k1], [v1]
        take = rows[..., None].expand(-1, -1, x_all.shape[-1])
        x = x_all.gather(1, take)
        hidden = hidden_all.gather(1, rows[..., None].expand(-1, -1, cfg.hidden_size))
        total = hidden.new_zeros(())
        agree = []
        for k in range(1, self.ttt + 1):
            # Row p holds the token at p + k and (k = 1) the target's states at p: RoPE position p + k - 1.
            if k > 1:
                tokens = ids.gather(1, (rows + k).clamp(max=s - 1))
                x = torch.cat([rms(self.embedding[tokens], layer.input_layernorm.weight, eps),
                               rms(hidden, layer.hidden_norm.weight, eps)], dim=-1)
                keys.append(rotate(F.linear(x, attn.k_proj.weight).view(b, -1, kv_heads, dim), rows + k - 1,
                                   self.cos, self.sin))
                values.append(F.linear(x, attn.v_proj.weight).view(b, -1, kv_heads, dim))
            q = rotate(F.linear(x, attn.q_proj.weight).view(b, -1, heads, dim), rows + k - 1, self.cos, self.sin)
            out = ttt_attention(q, rows, keys, values, dim ** -0.5)
            r = hidden + F.linear(out.reshape(b, rows.shape[1], -1), attn.o_proj.weight)
            y = rms(r, layer.post_attention_layernorm.weight, eps)
            prenorm = r + F.linear(F.silu(F.linear(y, mlp.gate_proj.weight)) * F.linear(y, mlp.up_proj.weight),
                                   mlp.down_proj.weight)
            logp = F.linear(rms(prenorm, d.norm.weight, eps), d.lm_head.weight).log_softmax(-1)
            if keep is not None:
                keep.append(logp.detach())
            # Row p guesses the token at p + k + 1: the target's distribution at position p + k.
            want = batch.probs[:, k - 1: k - 1 + rows.shape[1]].float()
            valid = batch.valid[:, k - 1: k - 1 + rows.shape[1]]
            ce = -(want * logp).sum(-1)
            total = total + TTT_DECAY ** (k - 1) * (ce * valid).sum() / valid.sum().clamp(min=1)
            agree.append(((logp.argmax(-1) == want.argmax(-1)) & valid).sum().item() / max(1, int(valid.sum())))
            hidden = prenorm
        return total, agree


def rotate(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x [B, R, heads, D] at positions [R] or [B, R]."""
    b, r = x.shape[:2]
    positions = positions.expand(b, r) if positions.dim() == 1 else positions
    flat = positions.reshape(-1)
    return apply_rope(x.reshape(b * r, x.shape[2], x.shape[3]), cos[flat], sin[flat]).view_as(x)


def ttt_attention(q: torch.Tensor, rows: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                  scale: float) -> torch.Tensor:
    """q [B, C, H, D] of step k = len(keys) at rows [B, C]: causal over step 1's keys (all positions,
    [B, S, KVH, D]), and each later step's key at the query's own row (its chain of earlier
    guesses). No sink, no window (the draft has neither)."""
    b, c, heads, dim = q.shape
    group = heads // keys[0].shape[2]
    k1 = keys[0].repeat_interleave(group, dim=2)
    v1 = values[0].repeat_interleave(group, dim=2)
    s = k1.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k1) * scale
    visible = torch.arange(s, device=q.device)[None, None, :] <= rows[:, :, None]  # [B, C, S]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    own = [(q * kj.repeat_interleave(group, dim=2)).sum(-1).transpose(1, 2)[..., None] * scale for kj in keys[1:]]
    probs = torch.cat([scores, *own], dim=-1).softmax(-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs[..., :s], v1)
    for j, vj in enumerate(values[1:]):
        out = out + probs[..., s + j].transpose(1, 2)[..., None] * vj.repeat_interleave(group, dim=2)
    return out


@dataclass
class Batch:
    ids: torch.Tensor  # [B, S] compact ids
    aux: torch.Tensor  # [B, S, 3H] the target's layer outputs
    rows: torch.Tensor  # [B, C] draft rows: the prompt's last position and the completion's (clamped)
    probs: torch.Tensor  # [B, C + TTT - 1, V] the target's distribution at position rows[:, 0] + 1 + i
    valid: torch.Tensor  # [B, C + TTT - 1] bool: that position predicts a completion token


@dataclass
class Example:
    ids: torch.Tensor
    prompt_len: int
    aux: torch.Tensor  # [S, 3H] bf16
    probs: torch.Tensor  # [S - prompt_len - 1, V] bf16: at positions prompt_len .. S - 2 (the ones a draft guesses)


def precompute(trainer: DraftTrainer, seqs: list[torch.Tensor], prompts: list[int], device: str) -> list[Example]:
    """The target's states and distributions of every example, once (the target runs no more)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: dict[int, Example] = {}
    for at in range(0, len(order), 32):
        group = order[at: at + 32]
        longest = max(len(seqs[i]) for i in group)
        ids = torch.zeros(len(group), longest, dtype=torch.int64)
        for row, i in enumerate(group):
            ids[row, : len(seqs[i])] = seqs[i]
        aux, probs = trainer.target_states(ids.to(device))
        for row, i in enumerate(group):
            n, p = len(seqs[i]), prompts[i]
            out[i] = Example(seqs[i], p, aux[row, :n].to(torch.bfloat16).cpu(),
                             probs[row, p: n - 1].to(torch.bfloat16).cpu())
    return [out[i] for i in range(len(seqs))]


def make_batch(examples: list[Example], ttt: int, device: str) -> Batch:
    longest = max(len(e.ids) for e in examples)
    # Row p - 1 holds the first completion token (the target's own, sampled at prefill) and guesses
    # the second: drafting starts there. Position q predicts token q + 1, a completion token up to n - 2.
    comp = max(len(e.ids) - 1 - e.prompt_len for e in examples)
    width = comp + ttt - 1
    v = examples[0].probs.shape[-1]
    b = len(examples)
    ids = torch.zeros(b, longest, dtype=torch.int64)
    aux = torch.zeros(b, longest, examples[0].aux.shape[-1], dtype=torch.bfloat16)
    rows = torch.zeros(b, comp, dtype=torch.int64)
    probs = torch.zeros(b, width, v, dtype=torch.bfloat16)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for r, e in enumerate(examples):
        n, p = len(e.ids), e.prompt_len
        ids[r, :n] = e.ids
        aux[r, :n] = e.aux
        rows[r] = (p - 1 + torch.arange(comp)).clamp(max=n - 1)
        m = min(width, n - 1 - p)
        probs[r, :m] = e.probs[:m]
        valid[r, :m] = True
    return Batch(ids.to(device), aux.to(device), rows.to(device), probs.to(device), valid.to(device))


def batches(cfg: DraftTrainConfig, vocab: list[int],
            version: int | None = None) -> tuple[list[torch.Tensor], list[int]]:
    """Training sequences over the target's compact ids, drawn from the corpus the target learned
    (`version`; default: the shipped weights'), whose tokens its vocabulary holds."""
    index = {t: i for i, t in enumerate(vocab)}
    seqs, prompts = [], []
    version = corpus_version(DEMO_WEIGHTS) if version is None else version
    for ex in draw_examples(random.Random(cfg.seed + 1), cfg.examples, "train", version=version):
        ids, prompt_len = tokenize(ex)
        seqs.append(torch.tensor([index[t] for t in ids]))
        prompts.append(prompt_len)
    return seqs, prompts


def draft_tensors(trainer: DraftTrainer) -> dict[str, torch.Tensor]:
    """The draft in SpecForge's names (bf16), with t2d over the full vocabulary."""
    out = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).detach().cpu().contiguous()
           for k, v in trainer.draft.state_dict().items()}
    t2d = torch.zeros(DEMO_CONFIG.vocab_size, dtype=torch.bool)
    t2d[torch.tensor(trainer.target.vocab)] = True
    out["t2d"] = t2d
    return out


def train(cfg: DraftTrainConfig) -> Path:
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    target = trainable_from_compact(str(DEMO_WEIGHTS), cfg.device)
    trainer = DraftTrainer(target, cfg)
    seqs, prompts = batches(cfg, target.vocab)
    examples = precompute(trainer, seqs, prompts, cfg.device)
    print(f"{len(examples)} examples, the target's states computed ({time.time() - t0:.0f} s)", flush=True)
    params = [p for p in trainer.draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    recent: deque[float] = deque(maxlen=50)
    agree: deque[list[float]] = deque(maxlen=50)
    step = 0
    for step in range(cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        pick = torch.randint(len(examples), (cfg.batch_size,), generator=gen).tolist()
        loss, acc = trainer.loss(make_batch([examples[i] for i in pick], cfg.ttt, cfg.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        recent.append(loss.item())
        agree.append(acc)
        out_of_time = cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds
        if step % 50 == 0 or step == cfg.steps - 1 or out_of_time:
            mean = [sum(a[k] for a in agree) / len(agree) for k in range(cfg.ttt)]
            print(f"step {step:5d}  loss {sum(recent) / len(recent):.4f}  top-1 agreement by step "
                  f"{' '.join(f'{a:.3f}' for a in mean)}  lr {lr:.2e}  {time.time() - t0:.0f} s", flush=True)
        if out_of_time:
            print(f"stopped by --max-seconds after {step + 1} of {cfg.steps} steps", flush=True)
            break
    hardware = torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu"
    meta = {k: str(v) for k, v in asdict(cfg).items() if k != "out"}
    meta |= {"train_seconds": f"{time.time() - t0:.0f}", "hardware": hardware, "steps_done": str(step + 1)}
    path = save_draft(draft_tensors(trainer), trainer.cfg.to_dict(), cfg.out, meta)
    print(f"saved {path} ({path.stat().st_size / 2**20:.1f} MiB) after {time.time() - t0:.0f} s on {hardware}",
          flush=True)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DraftTrainConfig(out="")
    p.add_argument("--out", required=True, help="the draft file to write (.safetensors)")
    for name in ("seed", "steps", "batch_size", "examples", "ttt", "intermediate_size"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--device", default=defaults.device)
    train(DraftTrainConfig(**vars(p.parse_args(argv))))


if __name__ == "__main__":
    main()
