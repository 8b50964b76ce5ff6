"""Which implementation an op runs: the Triton kernel on CUDA tensors, the plain-PyTorch
reference elsewhere — or the reference everywhere inside `reference_ops()`, which is how tests
and benchmarks compare the two paths on the same GPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_force_reference: ContextVar[bool] = ContextVar("osserve_force_reference", default=False)


def use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and not _force_reference.get()


@contextmanager
def reference_ops() -> Iterator[None]:
    token = _force_reference.set(True)
    try:
        yield
    finally:
        _force_reference.reset(token)
