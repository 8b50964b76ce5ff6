"""The python tool's sandbox against hostile code: each test runs real cells in a real sandbox
(user, mount, network and pid namespaces here) and checks what the model would be shown, that the
harm did not happen on the host, and that the session (or the next one) still answers."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from osserve.errors import ToolSetupError
from osserve.tools.python import sandbox as sandbox_module
from osserve.tools.python.sandbox import SandboxLimits, find_isolation
from osserve.tools.python.tool import UNSAFE_FLAG, PythonTool, python_description

ROOT = Path(__file__).resolve().parents[2]
FAST = SandboxLimits(wall_seconds=1.5, cpu_seconds=2, memory_bytes=1 << 30, max_processes=16)


def in_session(*cells: str, limits: SandboxLimits = FAST, allow_unsafe: bool = False) -> list[str]:
    """What the model is shown for each cell, run in order in one session."""
    async def run() -> list[str]:
        tool = await PythonTool.create(limits, allow_unsafe=allow_unsafe)
        session = tool.new_session()
        try:
            return [await tool.run(session, cell) for cell in cells]
        finally:
            await tool.close()

    return asyncio.run(asyncio.wait_for(run(), timeout=60))


def test_this_machine_has_the_sandbox() -> None:
    isolation, reason = find_isolation()
    assert isolation is not None, reason


def test_ordinary_code_prints_and_state_persists() -> None:
    first, second, third = in_session("x = 6\nprint(x * 7)", "x + 1", "y = x")
    assert first == "42\n"
    assert second == "7\n"  # the last expression's value, as a notebook shows it
    assert third.startswith("[WARN] No output available")


def test_a_traceback_shows_the_cells_frames_only() -> None:
    (out,) = in_session("def f(n):\n    return 10 // n\nprint('before')\nf(0)")
    assert out.startswith("before\n")
    assert 'File "<cell 1>", line 4, in <module>' in out and 'line 2, in f' in out
    assert out.rstrip().endswith("ZeroDivisionError: integer division or modulo by zero")
    assert "run_cell" not in out and "worker" not in out


def test_no_network_even_to_a_local_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        (out,) = in_session(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert "Network is unreachable" in out or "Connection refused" in out, out
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached it


def test_writes_stay_inside_the_sandbox(tmp_path: Path) -> None:
    name = f"osserve-sandbox-probe-{secrets.token_hex(6)}"
    outside = tmp_path / name
    cells = (f"open('/tmp/{name}', 'w').write('x')\nprint(open('/tmp/{name}').read())",
             f"open({str(outside)!r}, 'w').write('x')",
             f"open({str(ROOT / 'pyproject.toml')!r}, 'a').write('x')",
             "import os\nos.makedirs('/mnt/data/sub', exist_ok=True)\nn = open('/mnt/data/sub/f', 'w').write('kept')",
             "print(open('/mnt/data/sub/f').read())")
    private_tmp, elsewhere, repo_file, scratch, scratch_again = in_session(*cells)
    assert private_tmp == "x\n"  # /tmp inside is the session's own
    assert not Path(f"/tmp/{name}").exists()
    assert ("FileNotFoundError" in elsewhere or "Read-only file system" in elsewhere) and not outside.exists()
    assert "FileNotFoundError" in repo_file or "Read-only file system" in repo_file
    assert b"x" not in (ROOT / "pyproject.toml").read_bytes()[-2:]
    assert scratch.startswith("[WARN]") and scratch_again == "kept\n"


def test_an_endless_loop_is_interrupted_and_the_session_lives() -> None:
    out, after = in_session("x = 1\nwhile True:\n    pass", "print(x)")
    assert "KeyboardInterrupt" in out and "timed out after 1.5 seconds and was interrupted" in out
    assert after == "1\n"


def test_code_that_ignores_interrupts_is_killed_and_the_next_call_starts_afresh() -> None:
    loop = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nx = 1\nwhile True:\n    time.sleep(0.1)"
    out, after = in_session(loop, "print('x' in globals())")
    assert out.startswith("[ERROR] Execution timed out after 1.5 seconds; the python session was stopped")
    assert after == "False\n"


def test_a_64_gb_allocation_is_stopped() -> None:
    out, after = in_session("x = 5\nb = bytearray(64 << 30)", "print(x)")
    assert "MemoryError" in out and "[ERROR] Memory limit reached" in out
    assert after == "5\n"


def test_a_fork_bomb_is_contained() -> None:
    bomb = "import os\nwhile True:\n    os.fork()"
    count = "import os\nprint(sum(p.isdigit() for p in os.listdir('/proc')))"
    out, processes, after = in_session(bomb, count, "print('alive')")
    assert "BlockingIOError" in out or "timed out" in out, out
    assert processes == "2\n"  # the namespace's init and the session: nothing the bomb made is left
    assert after == "alive\n"


def test_cpu_limit_stops_a_busy_cell_before_the_wall_clock() -> None:
    limits = SandboxLimits(wall_seconds=20, cpu_seconds=1, max_processes=16)
    out, after = in_session("x = 3\nwhile True:\n    pass", "print(x)", limits=limits)
    assert "CPU time limit of 1 seconds exceeded" in out
    assert after == "3\n"


def test_the_code_has_no_privileges_and_no_server_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXA_API_KEY", "server-secret")
    (out,) = in_session("import os\nprint(os.environ.get('EXA_API_KEY'))\n"
                        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
                        "print(sorted(os.listdir('/')))")
    env, caps, listing = out.splitlines()
    assert env == "None" and int(caps, 16) == 0
    assert "home" not in listing and "var" not in listing


def test_a_nested_user_namespace_cannot_undo_the_read_only_root() -> None:
    """Unprivileged code may make a user namespace of its own and be root there, but the mounts it
    inherits are locked: remounting them writable fails."""
    script = ("mount -o remount,rw,bind /usr || echo usr-locked; mount -o remount,rw,bind / || echo root-locked; "
              "touch /usr/osserve-probe || echo usr-read-only")
    (out,) = in_session("import subprocess\nr = subprocess.run(['unshare', '--user', '--map-root-user', "
                        f"'--mount', 'sh', '-c', {script!r}], capture_output=True, text=True)\nprint(r.stdout)")
    assert out.split() == ["usr-locked", "root-locked", "usr-read-only"], out
    assert not Path("/usr/osserve-probe").exists()


def test_long_output_is_cut_and_says_so() -> None:
    limits = SandboxLimits(wall_seconds=5, max_output_chars=1000)
    (out,) = in_session("print('a' * 100000 + 'END')", limits=limits)
    assert "[... output truncated:" in out and out.rstrip().endswith("END")
    assert len(out) < 1200


def test_a_process_that_exits_is_reported_and_replaced() -> None:
    out, after = in_session("import os\nos._exit(3)", "print('new')")
    assert "The python process ended (exit code 3)" in out
    assert after == "new\n"


def test_a_cancelled_call_does_not_leak_into_the_next() -> None:
    async def run() -> str:
        tool = await PythonTool.create(FAST)
        session = tool.new_session()
        try:
            await tool.run(session, "x = 1")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(tool.run(session, "import time\ntime.sleep(0.5)\nprint('stale')"), 0.1)
            return await tool.run(session, "print('x' in globals())")
        finally:
            await tool.close()

    assert asyncio.run(run()) == "False\n"  # a new session, and no 'stale' output


def test_unprivileged_maps_also_isolate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The id maps a non-root server writes (only its own uid; setgroups denied) still give a
    read-only root and no network."""
    uid, gid = os.geteuid(), os.getegid()
    maps = {"setgroups": "deny", "uid_map": f"0 {uid} 1\n", "gid_map": f"0 {gid} 1\n"}
    monkeypatch.setattr("osserve.tools.python.session.id_maps", lambda: (maps, None))
    out, write = in_session("import os\nprint(os.getuid())", "open('/usr/x', 'w')")
    assert out == "0\n" and "Read-only file system" in write


def test_without_isolation_it_refuses_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("osserve.tools.python.tool.find_isolation", lambda: (None, "no namespaces here"))
    with pytest.raises(ToolSetupError, match=UNSAFE_FLAG):
        in_session("print(1)")
    assert in_session("x = 2", "print(x * 21)", allow_unsafe=True)[1] == "42\n"


def test_the_description_states_the_limits() -> None:
    text = python_description(SandboxLimits(wall_seconds=12))
    assert "stateful Jupyter notebook environment" in text and "time out after 12.0 seconds" in text
    assert "Internet access for this session is disabled" in text


def test_interpreter_trees_skip_system_and_nested_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module.sys, "base_prefix", "/usr")
    monkeypatch.setattr(sandbox_module.sys, "base_exec_prefix", "/usr")
    monkeypatch.setattr(sandbox_module.sys, "prefix", "/opt/venv")
    monkeypatch.setattr(sandbox_module.sys, "exec_prefix", "/opt/venv/sub")
    monkeypatch.setattr(sandbox_module.sys, "executable", "/usr/bin/python3")
    assert sandbox_module.interpreter_trees() == ["/opt/venv"]


def test_cli_prints_what_the_model_sees() -> None:
    result = subprocess.run([sys.executable, "-m", "osserve.cli", "tools", "run", "python",
                             "--python-tool-timeout", "5"], input="x = 6\nx * 7\n", capture_output=True,
                            text=True, cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"


def test_an_interpreter_under_tmp_still_starts(tmp_path: Path) -> None:
    """A checkout's venv under /tmp (the sandbox mounts its own scratch /tmp) is shown through it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    assert str(venv).startswith("/tmp/")
    site = next((venv / "lib").glob("python3*/site-packages"))
    # this venv sees the packages of the one running the tests (the sandboxed worker needs none)
    (site / "parent.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    result = subprocess.run([str(venv / "bin" / "python"), "-m", "osserve.cli", "tools", "run", "python",
                             "--python-tool-timeout", "5"], input="print(6 * 7)\n", capture_output=True,
                            text=True, cwd=ROOT, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "42\n"
