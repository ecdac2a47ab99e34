"""The first code a `python` tool call runs, in its own interpreter: isolate, then exec.

Run as ``python -I sandbox_boot.py SCRATCH LIMITS_JSON`` with the model's code in
``SCRATCH/main.py`` and the working directory ``SCRATCH``. In order:

1. resource limits (CPU seconds, address space, file size, open files, no core dumps);
2. a network namespace of its own when the kernel allows one (root, or an unprivileged
   user namespace): no interface but a down loopback, so no connection can leave;
3. an audit hook (PEP 578) that refuses, for the rest of the process: new processes
   (fork, exec, spawn, system, subprocess), sockets (unless the network is allowed),
   ctypes and other native-call modules, signals to other processes, writes and
   directory changes outside SCRATCH, reads outside SCRATCH and the Python installation,
   and rebinding a function's code (the hook's own included);
4. the model's code, as ``__main__``; an exception prints its traceback (the model's own
   frames only) to stderr and exits 1.

A refused operation raises ``PermissionError("sandbox: ...")`` inside the model's code, so
the model reads what was refused. This is defence in depth for model-written code, not a
boundary against a determined attacker: run untrusted tools in a container as well.
Imports nothing of agentr1 (it runs before any of it could be trusted).
"""

import contextlib
import json
import os
import resource
import sys

STATUS_FILE = ".sandbox.json"
"""Written in SCRATCH before the model's code runs: which isolation took effect."""


def _limit(kind: int, soft: int, hard: int | None = None) -> None:
    with contextlib.suppress(ValueError, OSError):  # a limit the OS lacks stays unset
        resource.setrlimit(kind, (soft, soft if hard is None else hard))


def _own_network() -> bool:
    """Move into a new network namespace; False where the kernel refuses."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        newnet, newuser = 0x40000000, 0x10000000
        ok = libc.unshare(newnet) == 0 or libc.unshare(newuser | newnet) == 0
    except Exception:
        return False
    finally:
        for name in [
            m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))
        ]:
            del sys.modules[name]
    return ok


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _install_hook(scratch: str, network: bool) -> None:
    read_roots = tuple(
        sorted(
            {
                os.path.realpath(p)
                for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
            }
            | {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
            | {"/dev/null", "/dev/urandom", "/dev/zero", "/usr/share/zoneinfo", "/etc/localtime"}
        )
    )
    write_roots = (scratch, "/dev/null")
    processes = frozenset(
        {
            "os.system",
            "os.exec",
            "os.spawn",
            "os.posix_spawn",
            "os.fork",
            "os.forkpty",
            "subprocess.Popen",
            "os.kill",
            "os.killpg",
            "pty.spawn",
        }
    )
    native = frozenset({"ctypes", "_ctypes", "cffi", "_cffi_backend", "_posixsubprocess", "mmap"})
    sockets = frozenset({"socket.__new__", "socket.connect", "socket.bind", "socket.sendto"})
    path_events = frozenset(
        {
            "os.remove",
            "os.rename",
            "os.rmdir",
            "os.mkdir",
            "os.chmod",
            "os.chown",
            "os.symlink",
            "os.link",
            "os.truncate",
            "os.utime",
            "shutil.rmtree",
            "shutil.copyfile",
            "shutil.move",
        }
    )
    listing = frozenset({"os.listdir", "os.scandir", "os.chdir"})
    realpath, fspath, under = os.path.realpath, os.fspath, _under

    def resolved(p: object) -> str | None:
        if isinstance(p, int):
            return None  # an open file descriptor: allowed already
        try:
            return realpath(fspath(p).decode() if isinstance(p, bytes) else fspath(p))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return "?"

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in processes:
            raise PermissionError(f"sandbox: {event} is not allowed (no new processes)")
        if event.startswith("ctypes.") or (event == "import" and args and args[0] in native):
            what = args[0] if event == "import" else event
            raise PermissionError(f"sandbox: {what} is not allowed (no native calls)")
        if event in sockets and not network:
            raise PermissionError("sandbox: network access is not allowed")
        if event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            raise PermissionError("sandbox: rebinding __code__ is not allowed")
        if event == "open" and args:
            path = resolved(args[0])
            if path is None:
                return
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writes = any(c in mode for c in "wax+") or flags & (
                os.O_WRONLY | os.O_RDWR | os.O_CREAT
            )
            if not under(path, write_roots) and (writes or not under(path, read_roots)):
                raise PermissionError(f"sandbox: {path} is outside the working directory")
        elif event in path_events or event in listing:
            for a in args[:2]:
                path = resolved(a) if isinstance(a, str | bytes | os.PathLike) else None
                if path is None:
                    continue
                roots = write_roots if event in path_events else (scratch, *read_roots)
                if not under(path, roots):
                    raise PermissionError(f"sandbox: {path} is outside the working directory")

    sys.addaudithook(hook)


def _run(scratch: str) -> int:
    with open(os.path.join(scratch, "main.py"), encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "main.py", "exec")
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # the model's error is its observation
        import traceback

        frames = [
            f
            for f in traceback.extract_tb(e.__traceback__)
            if f.filename != __file__ and not f.filename.endswith("sandbox_boot.py")
        ]
        print("Traceback (most recent call last):", file=sys.stderr)
        print("".join(traceback.format_list(frames)), end="", file=sys.stderr)
        print("".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    scratch, limits = os.path.realpath(sys.argv[1]), json.loads(sys.argv[2])
    cpu = int(limits["cpu_s"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    _limit(resource.RLIMIT_AS, int(limits["memory_mb"]) * 2**20)
    _limit(resource.RLIMIT_FSIZE, int(limits["file_mb"]) * 2**20)
    _limit(resource.RLIMIT_NOFILE, 64)
    _limit(resource.RLIMIT_CORE, 0)
    isolated = not limits["network"] and _own_network()
    with open(os.path.join(scratch, STATUS_FILE), "w", encoding="utf-8") as f:
        json.dump({"netns": isolated}, f)
    _install_hook(scratch, bool(limits["network"]))
    sys.argv = ["main.py"]
    return _run(scratch)


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
