"""Does the host's cost of structured outputs grow as a server runs? Serving with a JSON schema on
every request lost more in its second json round than in its first on most hosts (BENCHMARKS.md,
"Structured outputs"). Here, on the CPU, B requests of bench_structured.SCHEMA walk their grammar
as a random-weight model does: each step every row takes a token drawn uniformly from its own mask
(Grammars.masks, as the engine asks for it), and a request that reaches its grammar's end or
MAX_TOKENS is replaced by a new one (its grammar from the cache). Printed per window of steps: the
median ms a step of masks() and of accept(), the requests done, and the process's resident memory.

    PYTHONPATH=$PWD python3 benchmarks/diag/mask_drift.py [--batch 256] [--windows 6] [--window-steps 200]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_structured import SCHEMA  # noqa: E402
from osserve.config import preset  # noqa: E402
from osserve.structured.matchers import STOPPED, Grammars  # noqa: E402
from osserve.structured.spec import StructuredOutputs  # noqa: E402

MAX_TOKENS = 256


def draw(row: np.ndarray, vocab: int, rng: np.random.Generator) -> int:
    """A token allowed by a mask row (int32 words, bit set = allowed), uniformly: a few random tries,
    then among all the allowed ones."""
    for t in rng.integers(0, vocab, 16):
        if (int(row[t >> 5]) >> (int(t) & 31)) & 1:
            return int(t)
    allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab])
    return int(rng.choice(allowed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--window-steps", type=int, default=200)
    args = ap.parse_args()
    vocab = preset("20b").vocab_size
    spec = StructuredOutputs(harmony=True, json_schema=SCHEMA)
    grammars = Grammars(vocab)
    prepared = grammars.grammar_for(spec, MAX_TOKENS)  # as the engine starts a request
    assert prepared is not None
    text, free, bounded = prepared.text, prepared.free, prepared.bounded
    rng = np.random.default_rng(0)
    length: dict[str, int] = {}
    serial = 0

    def join() -> None:
        nonlocal serial
        rid = f"r{serial}"
        serial += 1
        grammars.start(rid, text, free, bounded)
        assert grammars.ready(wait=True) == [(rid, None)]
        length[rid] = 0

    for _ in range(args.batch):
        join()
    print("| window | masks ms a step | accept ms a step | requests done | RSS MiB |\n|---|---|---|---|---|")
    for window in range(args.windows):
        masks_ms, accept_ms, done = [], [], 0
        for _ in range(args.window_steps):
            rids = list(length)
            t = time.perf_counter()
            step = grammars.masks(rids)
            masks_ms.append(1e3 * (time.perf_counter() - t))
            assert step is not None and not step.dead, "a random walk met a dead end"
            rows = step.bits.numpy()
            sampled = {rids[r]: draw(rows[i], vocab, rng) for i, r in enumerate(step.rows)}
            finished = [rid for rid in rids if grammars.states[rid].key == STOPPED]  # its draw was a stop token
            t = time.perf_counter()
            rejected = grammars.accept(sampled)
            accept_ms.append(1e3 * (time.perf_counter() - t))
            assert not rejected, f"a token drawn from its own mask was rejected: {rejected}"
            for rid in rids:
                length[rid] += 1
                if rid in finished or length[rid] >= MAX_TOKENS:
                    grammars.drop(rid)
                    del length[rid]
                    done += 1
                    join()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"| {window} | {statistics.median(masks_ms):.2f} | {statistics.median(accept_ms):.2f} | {done} | "
              f"{rss:.0f} |", flush=True)


if __name__ == "__main__":
    main()
