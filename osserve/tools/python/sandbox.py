"""How the python tool's code is isolated: Linux namespaces, a read-only minimal root, rlimits.

A session is started as
    setpriv --pdeathsig KILL -- unshare --user --mount --net --pid --ipc --uts --fork --kill-child
        -- /bin/sh -c SETUP sh PYTHON -I -c WORKER CONFIG
(util-linux, which every Debian-like system has). The parent writes the new user namespace's id
maps itself (see `id_maps`), then SETUP, as root of that namespace:
- mounts a 1 MiB tmpfs as the new root on the session's own empty host folder, and bind-mounts into
  it, read-only, nosuid, nodev: /usr (and /bin, /lib... as the host has them), a few /etc files the
  dynamic linker and Python read, and the interpreter's own trees (sys.base_prefix, sys.prefix);
  /dev gets null, zero, full, random and urandom only; /proc is the new pid namespace's own;
- mounts a size-bounded tmpfs at /mnt (/mnt/data is the working folder, /tmp is /mnt/tmp): the only
  writable place, gone with the session;
- pivot_roots into it, drops the old root, remounts the new root read-only;
- runs the worker through setpriv with an empty capability bounding set, no inheritable or ambient
  capabilities and no_new_privs, so nothing can remount or regain privileges. Under a root server
  the code runs as uid 1000 of the namespace, which is the host's nobody (65534): not host root, so
  RLIMIT_NPROC holds (the kernel never applies it to host uid 0) and host files are seen with
  "other" permissions only. Under a non-root server the code keeps that user's uid (unprivileged
  maps allow no other), without capabilities; its supplementary groups stay (setgroups is denied).
The worker then sets hard rlimits (address space, CPU, file size, open files, processes, no core).

The network namespace has only a down loopback: no connection anywhere, not even to 127.0.0.1.
Limits: memory is bounded per process (RLIMIT_AS), so a session may hold up to max_processes times
memory_bytes, plus its tmpfs; there is no cgroup. Reads are limited to what the minimal root
shows (system files, the interpreter and its site-packages). The kernel's attack surface (system
calls) is not filtered (no seccomp).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 1000  # the code's uid inside the user namespace, under a root server
NOBODY = 65534  # ...which is this uid on the host
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group",
             "nsswitch.conf", "hosts", "os-release", "mime.types")
DEVICES = ("null", "zero", "full", "random", "urandom")
BINARIES = ("setpriv", "unshare", "mount", "umount", "pivot_root", "sh")
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CODE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    """What one python session may use. Per call: wall and CPU time; per process: memory, file
    size, open files; per session: processes (threads count), CPU in all, scratch space."""

    wall_seconds: float = 30.0
    cpu_seconds: int = 30
    session_cpu_seconds: int = 600
    memory_bytes: int = 2 << 30
    max_processes: int = 32
    max_file_bytes: int = 64 << 20
    max_open_files: int = 256
    scratch_bytes: int = 128 << 20
    max_output_chars: int = 10_000

    def worker_limits(self) -> dict[str, int]:
        return {"memory_bytes": self.memory_bytes, "session_cpu_seconds": self.session_cpu_seconds,
                "cell_cpu_seconds": self.cpu_seconds, "max_file_bytes": self.max_file_bytes,
                "max_open_files": self.max_open_files, "max_processes": self.max_processes}


@dataclass(frozen=True)
class Isolation:
    """The tools a sandboxed start needs, found on this machine; None where isolation is off."""

    binaries: dict[str, str] | None

    @property
    def isolated(self) -> bool:
        return self.binaries is not None


def find_isolation() -> tuple[Isolation | None, str]:
    """(the namespace sandbox, "") where util-linux is installed and unprivileged user, mount,
    network and pid namespaces work here; else (None, the reason)."""
    if sys.platform != "linux":
        return None, f"the python sandbox needs Linux namespaces (this is {sys.platform})"
    binaries = {name: shutil.which(name, path=SEARCH_PATH) for name in BINARIES}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        return None, f"the python sandbox needs util-linux's {', '.join(missing)} (not found)"
    found = {name: str(path) for name, path in binaries.items()}
    probe = [found["unshare"], "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork",
             found["mount"], "-t", "tmpfs", "-o", "size=4k", "probe", "/mnt"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"user namespaces cannot be created here ({exc})"
    if result.returncode != 0:
        why = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.returncode}"]
        return None, f"user namespaces cannot be created here ({why[0]})"
    return Isolation(found), ""


def interpreter_trees() -> list[str]:
    """The folders the sandbox must show for this interpreter to start: its prefixes, resolved,
    without those inside another one or inside a system folder that is bound anyway."""
    trees = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix,
                                                  sys.base_exec_prefix,
                                                  os.path.dirname(os.path.realpath(sys.executable)))})
    covered = [f"/{d}" for d in SYSTEM_DIRS]
    kept: list[str] = []
    for tree in trees:
        if tree == "/":
            raise OSError("the interpreter lives at / : the sandbox cannot show it read-only alone")
        if not any(tree == c or tree.startswith(c + "/") for c in covered + kept):
            kept.append(tree)
    return kept


def setup_script(binaries: dict[str, str], root: Path, go_fd: int, limits: SandboxLimits,
                 code_uid: int | None) -> str:
    """The shell text run as root of the new namespaces (see the module docstring)."""
    q = shlex.quote
    mount, setpriv = q(binaries["mount"]), q(binaries["setpriv"])
    lines = [
        "set -eu",
        f"PATH={SEARCH_PATH}",
        f"read -r _ < /proc/self/fd/{go_fd}",  # the parent has written our id maps
        f"{mount} --make-rprivate /",
        f"cd {q(str(root))}",
        f"{mount} -t tmpfs -o size=1m,mode=755,nosuid,nodev osserve-root .",
        f"cd {q(str(root))}",  # into the new mount
        "ro_bind() {",
        '  if [ -d "$1" ]; then mkdir -p "$2"; else mkdir -p "$(dirname "$2")"; touch "$2"; fi',
        f'  {mount} --bind "$1" "$2"',
        f'  {mount} -o remount,bind,ro,nosuid,nodev "$2"',
        "}",
        "for d in " + " ".join(SYSTEM_DIRS) + "; do",
        '  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$d"; elif [ -d "/$d" ]; then ro_bind "/$d" "$d"; fi',
        "done",
        "mkdir -p etc dev proc mnt tmp",
        "for f in " + " ".join(ETC_FILES) + "; do",
        '  if [ -e "/etc/$f" ]; then ro_bind "/etc/$f" "etc/$f"; fi',
        "done",
    ]
    lines += [
        "for n in " + " ".join(DEVICES) + '; do touch "dev/$n"; ' + mount + ' --bind "/dev/$n" "dev/$n"; done',
        "ln -s /proc/self/fd dev/fd; ln -s /proc/self/fd/0 dev/stdin",
        "ln -s /proc/self/fd/1 dev/stdout; ln -s /proc/self/fd/2 dev/stderr; ln -s /tmp dev/shm",
        f"{mount} -t proc -o nosuid,nodev,noexec proc proc",
        f"{mount} -t tmpfs -o size={limits.scratch_bytes},mode=755,nosuid,nodev osserve-scratch mnt",
        "mkdir mnt/data mnt/tmp && chmod 1777 mnt/tmp",
        f"chown {code_uid or 0}:{code_uid or 0} mnt/data",
        f"{mount} --bind mnt/tmp tmp",
    ]
    # The interpreter last: one installed under /tmp or /mnt (a venv in a temporary checkout) would
    # be hidden by the scratch mounts above; bound after them, it shows through in their place.
    lines += [f"ro_bind {q(tree)} {q('.' + tree)}" for tree in interpreter_trees()]
    lines += [
        "mkdir .old",
        f"{q(binaries['pivot_root'])} . .old",
        "cd /",
        f"{q(binaries['umount'])} -l /.old",
        "rmdir /.old",
        f"{mount} -o remount,bind,ro,nosuid,nodev /",
        "cd /mnt/data",
        f"PATH={CODE_PATH}",
        # The parent interrupts a cell with SIGINT to the process group: the shell (this
        # namespace's init, waiting on the worker) must not act on it; the worker sets its own.
        "trap '' INT",
    ]
    ids = f"--reuid={code_uid} --regid={code_uid} --clear-groups " if code_uid is not None else ""
    lines.append(f"{setpriv} {ids}--bounding-set=-all --inh-caps=-all --ambient-caps=-all "
                 '--no-new-privs -- "$@"')
    return "\n".join(lines) + "\n"


def id_maps() -> tuple[dict[str, str], int | None]:
    """The files the parent writes under /proc/PID/ for the new user namespace, and the uid the
    code runs as inside. Root maps namespace root to itself (the setup must read root's folders to
    bind them) and SANDBOX_UID to nobody, for the code; any other user may map only itself."""
    if os.geteuid() == 0:
        maps = {"uid_map": f"0 0 1\n{SANDBOX_UID} {NOBODY} 1\n",
                "gid_map": f"0 0 1\n{SANDBOX_UID} {NOBODY} 1\n"}
        return maps, SANDBOX_UID
    return ({"setgroups": "deny", "uid_map": f"0 {os.geteuid()} 1\n",
             "gid_map": f"0 {os.getegid()} 1\n"}, None)


def sandbox_argv(binaries: dict[str, str], root: Path, go_fd: int, limits: SandboxLimits,
                 code_uid: int | None, worker_argv: list[str]) -> list[str]:
    script = setup_script(binaries, root, go_fd, limits, code_uid)
    return [binaries["setpriv"], "--pdeathsig", "KILL", "--",
            binaries["unshare"], "--user", "--mount", "--net", "--pid", "--ipc", "--uts",
            "--fork", "--kill-child", "--", binaries["sh"], "-c", script, "sh", *worker_argv]


async def write_id_maps(pid: int, maps: dict[str, str], timeout: float = 5.0) -> None:
    """Wait until process `pid` (unshare) is in its own user namespace, then write its maps."""
    own = os.readlink("/proc/self/ns/user")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if os.readlink(f"/proc/{pid}/ns/user") != own:
                break
        except FileNotFoundError as exc:
            raise OSError("the sandbox process ended before its namespaces were made") from exc
        if loop.time() > deadline:
            raise OSError("the sandbox process did not make its user namespace in time")
        await asyncio.sleep(0.001)
    for name in ("setgroups", "uid_map", "gid_map"):
        if name in maps:
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(maps[name])


def code_environment(isolated: bool, home: str) -> dict[str, str]:
    """The environment the code sees: nothing of the server's (no keys, no tokens)."""
    return {"PATH": CODE_PATH if isolated else os.defpath, "HOME": home, "TMPDIR": "/tmp" if isolated else home,
            "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "MPLBACKEND": "Agg",
            # BLAS and OpenMP would start a thread a core: they count against max_processes.
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
