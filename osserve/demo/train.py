"""Training the built-in demo model: `python -m osserve.demo.train --out FILE [--seed 0] [--steps N]`.

With `--init COMPACT` it fine-tunes a compact checkpoint instead of starting from random weights:
the checkpoint's tokens keep their rows and order, the corpus's new tokens are appended
(compact.load_trainable says how their rows start), and the defaults suit a fine-tune (a lower
peak learning rate, a short warmup, MXFP4-rounded experts from the first step, since the
checkpoint's experts already sit on the MXFP4 grid). The checkpoint's metadata records the init.

Draws the synthetic corpus (demo/corpus.py), trains DemoTrainable with AdamW on the completion
tokens only, fake-quantises the experts to MXFP4 for the last part of training, and saves the
compact checkpoint (demo/compact.py). Everything random comes from --seed: the corpus, the
initial weights and the batch order. On one H100 the default run takes a few minutes; it also
runs on a CPU, slowly. BENCHMARKS.md and README.md say how the shipped weights were made.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from collections import deque
from dataclasses import asdict, dataclass
from multiprocessing import Pool
from pathlib import Path

import torch

from osserve.demo.compact import compact_vocab, corpus_version, load_trainable, save_compact
from osserve.demo.corpus import CORPUS_VERSION, Example, draw_examples, tokenize
from osserve.demo.trainable import DEMO_CONFIG, DemoTrainable


@dataclass
class TrainConfig:
    out: str
    seed: int = 0
    steps: int = 3000
    batch_size: int = 128
    examples: int = 60_000
    lr: float = 3e-3
    warmup: int = 150
    weight_decay: float = 0.01
    balance_coef: float = 0.01
    qat_fraction: float = 0.3  # the last 30% of steps see MXFP4-rounded experts
    max_seconds: float | None = None  # a safety stop (the run is then not the seeded one: logged)
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    init: str | None = None  # a compact checkpoint to fine-tune (None: random weights)
    log_every: int = 100


# What --init changes where the command line does not say: the weights start trained, so a
# third of the peak rate, a short warmup, and QAT throughout.
FINETUNE_DEFAULTS = {"lr": 1e-3, "warmup": 20, "qat_fraction": 1.0, "log_every": 10}


def _tokenize_chunk(examples: list[Example]) -> list[tuple[list[int], int]]:
    return [tokenize(ex) for ex in examples]


def tokenized_corpus(seed: int, n: int) -> list[tuple[list[int], int]]:
    examples = draw_examples(random.Random(seed), n, "train")
    workers = max(1, min(16, (os.cpu_count() or 1) - 1))
    chunks = [examples[i::workers] for i in range(workers)]
    if workers == 1:
        return _tokenize_chunk(examples)
    with Pool(workers) as pool:
        parts = pool.map(_tokenize_chunk, chunks)
    return [item for part in parts for item in part]


class Batches:
    """Random batches of padded compact ids, next-token targets and the completion mask."""

    def __init__(self, corpus: list[tuple[list[int], int]], vocab: list[int], seed: int, device: str) -> None:
        index = {tok: i for i, tok in enumerate(vocab)}
        self.seqs = [torch.tensor([index[t] for t in ids]) for ids, _ in corpus]
        self.prompt_lens = [p for _, p in corpus]
        self.gen = torch.Generator().manual_seed(seed)
        self.device = device

    def next(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pick = torch.randint(len(self.seqs), (size,), generator=self.gen).tolist()
        longest = max(len(self.seqs[i]) for i in pick)
        ids = torch.zeros(size, longest, dtype=torch.int64)
        targets = torch.zeros_like(ids)
        mask = torch.zeros(size, longest, dtype=torch.bool)
        for row, i in enumerate(pick):
            s = self.seqs[i]
            ids[row, : len(s)] = s
            targets[row, : len(s) - 1] = s[1:]
            mask[row, self.prompt_lens[i] - 1 : len(s) - 1] = True  # predict every completion token
        return ids.to(self.device), targets.to(self.device), mask.to(self.device)


def learning_rate(cfg: TrainConfig, step: int, elapsed: float = 0.0) -> float:
    """Linear warmup, then a cosine to 5% of the peak. With --max-seconds the cosine runs on
    whichever ends first, the steps or the seconds, so a run stopped by time ends at the low rate."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    if cfg.max_seconds is not None:
        progress = min(1.0, max(progress, elapsed / cfg.max_seconds))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(cfg: TrainConfig) -> Path:
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    corpus = tokenized_corpus(cfg.seed, cfg.examples)
    used = {t for ids, _ in corpus for t in ids}
    if cfg.init is None:
        vocab = sorted(used)
        model = DemoTrainable(DEMO_CONFIG, vocab, DEMO_CONFIG.vocab_size)
        model.init_weights(torch.Generator().manual_seed(cfg.seed))
    else:
        old = compact_vocab(cfg.init)
        vocab = old + sorted(used - set(old))
        model = load_trainable(cfg.init, vocab, torch.Generator().manual_seed(cfg.seed))
        print(f"init: {cfg.init} ({len(old)} tokens; {len(vocab) - len(old)} new ones appended)", flush=True)
    print(f"corpus: {len(corpus)} examples, {sum(len(i) for i, _ in corpus)} tokens, {len(used)} distinct "
          f"tokens ({time.time() - t0:.0f} s)", flush=True)
    model.to(cfg.device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.98))
    batches = Batches(corpus, vocab, cfg.seed, cfg.device)
    qat_start = int(cfg.steps * (1 - cfg.qat_fraction))
    t_train = time.time()
    recent: deque[float] = deque(maxlen=50)  # the logged loss: the mean of the last 50 steps
    for step in range(cfg.steps):
        model.quantize_experts = step >= qat_start
        lr = learning_rate(cfg, step, time.time() - t0)
        for group in opt.param_groups:
            group["lr"] = lr
        ids, targets, mask = batches.next(cfg.batch_size)
        loss, balance = model.loss(ids, targets, mask)
        opt.zero_grad(set_to_none=True)
        (loss + cfg.balance_coef * balance).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item())
        loss_avg = sum(recent) / len(recent)
        out_of_time = cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds
        if step % cfg.log_every == 0 or step == cfg.steps - 1 or out_of_time:
            mode = "mxfp4 " if model.quantize_experts else ""
            print(f"step {step:5d}  loss {loss_avg:.4f}  balance {balance.item():.3f}  "
                  f"lr {lr:.2e}  {mode}{time.time() - t_train:.0f} s", flush=True)
        if out_of_time:
            print(f"stopped by --max-seconds after {step + 1} of {cfg.steps} steps", flush=True)
            break
    seconds = time.time() - t0
    device_name = torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu"
    meta = {k: str(v) for k, v in asdict(cfg).items() if k not in ("out", "init", "log_every")}
    if cfg.init is not None:
        meta["init"] = Path(cfg.init).name
        meta["init_corpus_version"] = str(corpus_version(cfg.init))
    meta |= {"train_seconds": f"{seconds:.0f}", "hardware": device_name, "final_loss": f"{loss_avg:.4f}",
             "steps_done": str(step + 1), "corpus_version": str(CORPUS_VERSION)}
    path = save_compact(model, cfg.out, meta)
    print(f"saved {path} ({path.stat().st_size / 2**20:.1f} MiB) after {seconds:.0f} s on {device_name}", flush=True)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = TrainConfig(out="")
    p.add_argument("--out", required=True, help="the compact checkpoint to write (.safetensors)")
    p.add_argument("--init", default=None, help="a compact checkpoint to fine-tune (its tokens keep their rows)")
    for name in ("seed", "steps", "batch_size", "examples", "warmup", "log_every"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    for name in ("lr", "qat_fraction"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--device", default=defaults.device)
    args = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    if "init" in args:
        args = FINETUNE_DEFAULTS | args
    train(TrainConfig(**args))


if __name__ == "__main__":
    main()
