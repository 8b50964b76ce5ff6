"""Prints, in every Python process started with this folder on PYTHONPATH and OSSERVE_TRACE_STEPS=1
(the engine's and each tensor-parallel worker's, which inherit the environment), the path each
runner step takes: a decode graph, a mixed-step graph (T, Q) or eager with T tokens. Ranks that take
different paths issue collectives of different sizes; the last lines of each rank show where they
parted (benchmarks/diag/tp_hang.py):

    OSSERVE_TRACE_STEPS=1 PYTHONPATH=benchmarks/diag/trace_steps:$PYTHONPATH python3 benchmarks/diag/tp_hang.py ...
"""

import os
import sys

if os.environ.get("OSSERVE_TRACE_STEPS"):
    from osserve.engine.worker.runner import ModelRunner

    original = ModelRunner._run
    counter = [0]

    def traced(self, entries, prev_tokens, copies, speculative, capture):  # type: ignore[no-untyped-def]
        lens = [len(e.token_ids) for e in entries]
        if self.graphs is not None and self.graphs.can_run(len(entries)) and all(n == 1 and e.sample for n, e in
                                                                                  zip(lens, entries, strict=True)):
            path = f"graph b={len(entries)} holds={self.graphs.holds(prev_tokens)}"
        elif self.mixed is not None and self.mixed.shape_for(lens) is not None:
            path = f"mixed {self.mixed.shape_for(lens)}"
        else:
            path = f"eager T={sum(lens)}"
        counter[0] += 1
        prev = None if prev_tokens is None else int(prev_tokens.shape[0])
        print(f"[trace pid {os.getpid()} head={self.head}] step {counter[0]}: {len(entries)} seqs, "
              f"T={sum(lens)} Q={max(lens, default=0)}, prev={prev}, copies={len(copies or [])}: {path}",
              file=sys.stderr, flush=True)
        return original(self, entries, prev_tokens, copies, speculative, capture)

    ModelRunner._run = traced  # type: ignore[method-assign]
