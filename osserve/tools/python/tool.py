"""harmony's `python` tool: what the model is told about it, and its sessions (one a conversation).

gpt-oss was trained on a stateful Jupyter-like python tool: names defined in one call are there in
the next. Sessions here are stateful the same way; the number alive at once is bounded, the least
recently used one is stopped past it (its next call starts afresh and says so).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from openai_harmony import ToolNamespaceConfig

from osserve.errors import ToolSetupError
from osserve.tools.python.sandbox import Isolation, SandboxLimits, find_isolation
from osserve.tools.python.session import PythonSession, SandboxStartError

log = logging.getLogger(__name__)

UNSAFE_FLAG = "--allow-unsafe-python-tool"


def python_description(limits: SandboxLimits) -> str:
    """harmony's own python namespace text (the words the model was trained on), with this
    server's time limit and network access."""
    return (
        "Use this tool to execute Python code in your chain of thought. The code will not be shown to "
        "the user. This tool should be used for internal reasoning, but not for code that is intended "
        "to be visible to the user (e.g. when creating plots, tables, or files).\n\n"
        "When you send a message containing Python code to python, it will be executed in a stateful "
        "Jupyter notebook environment. python will respond with the output of the execution or time "
        f"out after {limits.wall_seconds:.1f} seconds. The drive at '/mnt/data' can be used to save and "
        "persist user files. Internet access for this session is disabled."
    )


def python_namespace(limits: SandboxLimits) -> ToolNamespaceConfig:
    """The python namespace harmony's system message shows (what the demo corpus renders, too)."""
    return ToolNamespaceConfig(name="python", description=python_description(limits), tools=[])


class PythonTool:
    """Starts sandboxed python sessions. Build it with `await PythonTool.create(...)`, which
    refuses where isolation cannot be set up unless `allow_unsafe` is given."""

    name = "python"

    def __init__(self, isolation: Isolation | None, limits: SandboxLimits, max_sessions: int = 64) -> None:
        self.isolation = isolation
        self.limits = limits
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, PythonSession] = OrderedDict()

    @classmethod
    async def create(cls, limits: SandboxLimits | None = None, *, allow_unsafe: bool = False,
                     max_sessions: int = 64) -> PythonTool:
        """Finds the isolation, then runs one cell end to end so a broken sandbox fails at start."""
        limits = limits or SandboxLimits()
        isolation, reason = find_isolation()
        if isolation is None:
            if not allow_unsafe:
                raise ToolSetupError(f"the python tool cannot be isolated: {reason}. Pass {UNSAFE_FLAG} "
                                     "to run model-written code without isolation (rlimits only)")
            log.warning("python tool WITHOUT isolation (%s): model-written code runs as this user", reason)
        tool = cls(isolation, limits, max_sessions)
        session = tool.new_session()
        try:
            answer = await session.run("print(6 * 7)")
        except SandboxStartError as exc:
            raise ToolSetupError(f"the python tool cannot start: {exc}") from exc
        finally:
            await session.close()
        if answer.strip() != "42":
            raise ToolSetupError(f"the python tool's self-check printed {answer[:500]!r}, not 42")
        return tool

    @property
    def isolated(self) -> bool:
        return self.isolation is not None

    def namespace_config(self) -> ToolNamespaceConfig:
        return python_namespace(self.limits)

    def new_session(self) -> PythonSession:
        return PythonSession(self.isolation, self.limits)

    async def run(self, session: PythonSession, code: str) -> str:
        """Runs `code` in `session` (what the model sees); stops the least recently used other
        session when more than max_sessions would be alive."""
        self._sessions.pop(id(session), None)
        self._sessions[id(session)] = session
        while len(self._sessions) > self.max_sessions:
            _, oldest = self._sessions.popitem(last=False)
            await oldest.close()
        try:
            return await session.run(code)
        except SandboxStartError as exc:
            log.error("python sandbox start failed: %s", exc)
            return "[ERROR] The python sandbox could not start; the code was not run."

    async def release(self, session: PythonSession) -> None:
        self._sessions.pop(id(session), None)
        await session.close()

    async def close(self) -> None:
        while self._sessions:
            _, session = self._sessions.popitem()
            await session.close()
