"""The step loop's host-time profile (engine.py fills it each step; the server logs a window of it
every `every` steps, benchmarks/profile_host.py and profile_serving.py read it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields, replace


@dataclass
class StepProfile:
    """Where the step loop's wall time goes (host clock). `launch` is building the batch and
    queueing the forward and the sampler; `gpu_wait` is waiting for a step's sampled ids, wherever
    the loop waits for them; `grammar` is feeding the structured-output matchers and filling their
    masks (of it, `grammar_accept` feeding them and `mask_wait` waiting for llguidance's mask
    threads, or the grammar processes, after the step before's outputs; with the processes,
    `process_start` and `process_work` split the step's last reply: from the loop's message to that
    process taking it up, then to its reply); `post` is stop checks,
    detokenisation and deltas. `admit` is the step's start, taking in requests whose grammar is
    compiled (with the grammar processes, a round trip to them); `in_step` is the whole of each
    step() call, so that what the parts above leave out shows; `between` is the caller's time from
    one step() to the next while requests were unfinished (taking new ones in, sending the deltas
    out)."""

    steps: int = 0
    requests: int = 0
    schedule: float = 0.0
    launch: float = 0.0
    gpu_wait: float = 0.0
    post: float = 0.0
    grammar: float = 0.0
    grammar_accept: float = 0.0
    mask_wait: float = 0.0
    process_start: float = 0.0
    process_work: float = 0.0
    admit: float = 0.0
    in_step: float = 0.0
    between: float = 0.0
    steps_with_prefill: int = 0  # these run eagerly; decode-only steps replay a CUDA graph (GPU)
    steps_in_flight: int = 0  # left running while the next one was scheduled (async scheduling)
    prefills_beside: int = 0  # steps with prompt tokens launched while another was in flight (async prefill)
    launched_early: int = 0  # scheduled while the step before's masks filled, launched by it (engine.py)
    every: int = 500

    def add(self, batch: int, schedule: float, launch: float, post: float, has_prefill: bool = False,
            in_flight: bool = False, beside: bool = False) -> None:
        """One step's launch and outputs (gpu_wait and grammar are added where they happen);
        beside: it was launched while the step before was in flight."""
        self.steps += 1
        self.steps_with_prefill += has_prefill
        self.prefills_beside += has_prefill and beside
        self.steps_in_flight += in_flight
        self.requests += batch
        self.schedule += schedule
        self.launch += launch
        self.post += post

    def since(self, earlier: StepProfile) -> StepProfile:
        """What was added after `earlier` (a copy of this profile taken then)."""
        return replace(self, **{f.name: getattr(self, f.name) - getattr(earlier, f.name)
                                for f in fields(self) if f.name != "every"})

    def summary(self) -> str:
        n = max(self.steps, 1)
        parts = self.schedule + self.launch + self.gpu_wait + self.grammar + self.post + self.admit
        return (f"{self.steps} steps ({self.steps_with_prefill} with prefill, {self.prefills_beside} of them launched "
                f"beside a step in flight, {self.steps_in_flight} left in flight, {self.launched_early} launched "
                f"early), mean batch {self.requests / n:.1f}; "
                f"ms per step: schedule "
                f"{1000 * self.schedule / n:.2f}, build+launch {1000 * self.launch / n:.2f}, wait for GPU "
                f"{1000 * self.gpu_wait / n:.2f}, grammar {1000 * self.grammar / n:.2f}{self._grammar_parts(n)}, "
                f"outputs {1000 * self.post / n:.2f}, admitting {1000 * self.admit / n:.2f}, the rest of the step "
                f"{1000 * (self.in_step - parts) / n:.2f}, between steps {1000 * self.between / n:.2f}")

    def _grammar_parts(self, n: int) -> str:
        if not self.grammar:
            return ""
        processes = "" if not self.process_work else (
            f"; the last grammar process to reply took the step up after {1000 * self.process_start / n:.2f} "
            f"and worked {1000 * self.process_work / n:.2f}")
        return (f" (accept {1000 * self.grammar_accept / n:.2f}, "
                f"waiting for the masks {1000 * self.mask_wait / n:.2f}{processes})")


@dataclass
class ProfileLog:
    """The server's log of a step profile: every `every` steps, the window since the last line (a
    summary from the start would hide a change of load, e.g. schema-bound rounds after plain ones)."""

    logger: logging.Logger
    logged: StepProfile = field(default_factory=StepProfile)

    def after_step(self, profile: StepProfile) -> None:
        # An engine call that launched no step (one that only collects the step in flight, as the
        # last ones do) leaves the count where it was logged: no empty window.
        if not profile.steps or profile.steps % profile.every or profile.steps == self.logged.steps:
            return
        if profile.steps < self.logged.steps:  # a new profile (the warm-up's reset)
            self.logged = StepProfile()
        self.logger.info("engine: steps %d-%d: %s", self.logged.steps + 1, profile.steps,
                         profile.since(self.logged).summary())
        self.logged = replace(profile)
