"""`osserve tools run python`: stdin's code through the python tool's sandbox, printing exactly what
the model would be shown (for operators checking the sandbox, and for tests with hostile code)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from osserve.tools.python.sandbox import SandboxLimits
    from osserve.tools.registry import ToolServerOptions


def add_python_tool_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The python tool's flags (shared with `serve --tool-server demo`)."""
    p.add_argument("--allow-unsafe-python-tool", action="store_true",
                   help="where the kernel's isolation (user, mount, network and pid namespaces) cannot be "
                        "set up, run model-written python anyway, limited by rlimits only: UNSAFE")
    p.add_argument("--python-tool-timeout", type=float, default=30.0,
                   help="wall-time limit of one python call in seconds (CPU time too)")
    p.add_argument("--python-tool-memory-mb", type=int, default=2048,
                   help="address-space limit of each process of a python session, in MiB")


def add_tools_parser(sub: argparse._SubParsersAction) -> None:
    tools = sub.add_parser("tools", help="run a built-in tool as the model would call it")
    tools_sub = tools.add_subparsers(dest="tools_command", required=True)
    run = tools_sub.add_parser("run", help="run stdin's input through a built-in tool and print what the "
                                           "model would see")
    run.add_argument("tool", choices=("python",))
    add_python_tool_args(run)


def python_limits(args: argparse.Namespace) -> SandboxLimits:
    from osserve.tools.python.sandbox import SandboxLimits

    seconds = args.python_tool_timeout
    return SandboxLimits(wall_seconds=seconds, cpu_seconds=max(1, round(seconds)),
                         memory_bytes=args.python_tool_memory_mb << 20)


def tool_server_options(args: argparse.Namespace) -> ToolServerOptions:
    """`osserve serve`'s tool flags as the registry takes them."""
    from pathlib import Path

    from osserve.tools.registry import ToolServerOptions

    timeout = args.tool_call_timeout
    if timeout <= 0 or args.python_tool_timeout <= 0:
        from osserve.errors import ConfigError

        raise ConfigError("--tool-call-timeout and --python-tool-timeout must be positive", "tool_call_timeout")
    documents = Path(args.browser_documents) if args.browser_documents else None
    return ToolServerOptions(python_limits=python_limits(args), allow_unsafe_python_tool=args.allow_unsafe_python_tool,
                             browser=args.browser_backend, browser_documents=documents, mcp_call_timeout=timeout,
                             browser_call_timeout=timeout, allowed_server_urls=tuple(args.allow_tool_server_url))


def run_tools_command(args: argparse.Namespace) -> int:
    from osserve.errors import ToolSetupError
    from osserve.tools.python.tool import PythonTool

    code = sys.stdin.read()

    async def run() -> str:
        tool = await PythonTool.create(python_limits(args), allow_unsafe=args.allow_unsafe_python_tool)
        session = tool.new_session()
        try:
            return await tool.run(session, code)
        finally:
            await tool.release(session)

    try:
        output = asyncio.run(run())
    except ToolSetupError as exc:
        print(f"osserve: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(output if output.endswith("\n") else output + "\n")
    return 0
