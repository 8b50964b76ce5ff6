"""The Triton kernels a GPU engine process compiles, and a warning for each one compiled after the
warm-up (warm_up.py): the step that first needs such a kernel waits for its compile (about a second
each on a fresh machine), so each warning names a shape or specialisation the warm-up missed.

Triton specialises a kernel on its constexprs and, unseen in the source, on its other arguments:
a pointer 16-byte aligned or not, an integer divisible by 16 or equal to 1. So a kernel the warm-up
ran can compile again for the first requests; the warning lists what sets the new compile apart
from the closest one before it.

It rides on Triton's post-compile hook (`triton.knobs.runtime.jit_post_compile_hook`, called once
per kernel and specialisation in a process, a disk-cache hit included): a process-wide setting of
Triton's, which build_engine sets once, in the engine's own process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("osserve")

Specialisation = dict[str, str]  # argument name -> its type, constant value or attributes


@dataclass
class CompileLog:
    """Every compile's specialisation by kernel (a handful each); once serving, each new one warned of."""

    serving: bool = False  # set once the warm-up is over: compiles from then on are warned of
    compiled: dict[str, list[Specialisation]] = field(default_factory=dict)  # kernel -> its compiles

    @classmethod
    def install(cls) -> CompileLog:
        import triton

        compiles = cls()
        triton.knobs.runtime.jit_post_compile_hook = compiles.hook
        return compiles

    def hook(self, *, fn: Any, compile: dict[str, Any], **_: Any) -> None:
        """Triton's post-compile hook: fn its JitFunctionInfo, compile its signature, constants and
        attributes (configs[0], keyed by argument index paths like constants)."""
        kernel = f"{fn.module}.{fn.name}"
        spec = specialisation(fn.jit_function, compile)
        earlier = self.compiled.setdefault(kernel, [])
        if self.serving:
            self.warn(kernel, spec, earlier)
        earlier.append(spec)

    def warn(self, kernel: str, spec: Specialisation, earlier: list[Specialisation]) -> None:
        if earlier:
            closest = min(earlier, key=lambda e: len(differences(e, spec)))
            what = "; ".join(f"{name}: {closest.get(name, '-')} before, {spec.get(name, '-')} now"
                             for name in differences(closest, spec))
        else:
            what = "first compile; " + ", ".join(f"{k}{v}" for k, v in spec.items() if v.startswith("="))
        log.warning("Triton compiled %s after the warm-up (%s): the step that needed it waited for it", kernel, what)


def specialisation(kernel: Any, compile: dict[str, Any]) -> Specialisation:
    """Each argument as Triton compiled it: `=VALUE` for a constant (constexprs, and integers
    specialised to 1), else its type and attributes (`*bf16 tt.divisibility=16`)."""
    names = [p.name for p in getattr(kernel, "params", [])]

    def name(path: Any) -> str:
        i = path[0] if isinstance(path, tuple) and len(path) == 1 else path
        return names[i] if isinstance(i, int) and 0 <= i < len(names) else str(path)

    spec = {str(k): str(v) for k, v in compile.get("signature", {}).items() if v != "constexpr"}
    configs = compile.get("configs") or [{}]
    for path, attrs in (configs[0] or {}).items():
        spec[name(path)] = spec.get(name(path), "") + "".join(f" {a}={v}" for a, v in attrs)
    for path, value in compile.get("constants", {}).items():
        spec[name(path)] = f"={value}"
    return spec


def differences(a: Specialisation, b: Specialisation) -> list[str]:
    return [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
