"""MaskUpload on the CPU: the masks reach the sampler as given (the GPU's side stream is tested in
tests/gpu/test_small_ops_gpu.py)."""

from __future__ import annotations

import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.worker.sampler import MaskUpload, Sampler, SamplingBatch


def test_uploaded_masks_constrain_the_sampled_rows() -> None:
    vocab, words = 100, 4
    upload = MaskUpload(torch.device("cpu"))
    bits = torch.zeros(2, words, dtype=torch.int32)
    bits[0, 1] = 1 << 3  # row 2 may take token 35 only
    bits[1, 2] = 1 << 0  # row 0 may take token 64 only
    rows, device_bits = upload.upload([2, 0], bits)
    assert rows.tolist() == [2, 0] and torch.equal(device_bits, bits)
    params = [SamplingParams(temperature=1.0)] * 3
    batch = SamplingBatch.build(params, [[1]] * 3, [[]] * 3, [None] * 3, torch.device("cpu"), vocab,
                                token_masks=(rows, device_bits))
    for _ in range(5):
        ids = Sampler().sample(torch.randn(3, vocab), batch).token_ids.tolist()
        assert ids[2] == 35 and ids[0] == 64
    upload.sampled()  # nothing to record on the CPU


def test_masks_in_parts_arrive_as_one_block() -> None:
    upload = MaskUpload(torch.device("cpu"))
    first, second = torch.arange(8, dtype=torch.int32).view(2, 4), torch.arange(8, 12, dtype=torch.int32).view(1, 4)
    rows, device_bits = upload.upload([1, 2, 0], [first, second])
    assert rows.tolist() == [1, 2, 0] and torch.equal(device_bits, torch.arange(12, dtype=torch.int32).view(3, 4))
