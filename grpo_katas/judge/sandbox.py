"""How the worker and a loop's runs are started, limited, measured and stopped.

Two sandboxes share these modes and limits: the worker's (the checks' calls) and the run's (a loop trained by
grpo_katas.training.runner: `make run`, and the brief's run the judge makes; `start_run`). A run's sandbox holds the
runner and the lab, never the judge's files, and is the same for `make run` and the judge: the same paths, cwd,
environment, limits, command line and file descriptors, so nothing a loop can look at tells a judged run from a
practice run.

Two modes, chosen by `resolve`:
- "bubblewrap" (Linux with bubblewrap 0.8 or later and user namespaces): the worker sees only the Python
  environment (read-only), lab/, the files it runs (WORKER_FILES: judge/__init__, wire, standins, worker, and the
  runner `make run` uses for the brief's run) and the target files, all read-only, plus an empty /tmp of DISK_MB,
  its one writable place: the root and /dev are read-only, and /dev holds only the device nodes the worker opens
  (DEVICES; no /dev/shm, no terminal). No repository, no checks/, no solutions/, no katas/, no output folder; no network (its own empty network namespace); its own PID namespace, so killing bubblewrap
  kills every process the worker started, including ones that called setsid. It holds no capability, whoever
  runs the judge: bubblewrap run by root keeps every capability inside the sandbox unless told to drop them, and
  with CAP_SYS_ADMIN a worker can remount its read-only binds writable. It cannot create user namespaces of its
  own either. The probe refuses a bubblewrap that would leave the worker any capability.
- "process" (where bubblewrap cannot run): a plain `python -I` child in its own session, run as the user who
  runs the judge. Same protocol, limits and budgets, but no isolation: it can read and write whatever that user
  can, use the network, signal or ptrace the judge (SIGSTOP it, or read its memory), and processes it
  double-forks can outlive it. Fit for checking your own code, not for grading someone else's.
Both get an address-space limit, a CPU-time backstop, a size limit on every file they write (RLIMIT_FSIZE: a
write past it fails), no core files, stdout and stderr to one capped file nobody reads, a clean environment,
and SIGKILL when the judge dies. Those limits are each process's own; where this machine lets the judge make a
cgroup (root, or a delegated subtree), each sandbox's whole tree is also capped there, its memory (the same
memory_gb, page cache and its /tmp included) and its tasks (processes and threads: no fork bomb), and every process
left in it is killed when the sandbox is (`Group`; `describe` says which caps hold).
"""
import contextlib
import ctypes
import fcntl
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grpo_katas import ROOT


WORKER_FILES = ["grpo_katas/__init__.py", "grpo_katas/judge/__init__.py", "grpo_katas/judge/wire.py",
                "grpo_katas/judge/standins.py", "grpo_katas/judge/worker.py"]
INSIDE = Path("/judge")          # where lab/ and the worker's files appear inside the sandbox
# a run's sandbox: the runner and what it imports, under RUN_ROOT; the loop file as LOOP/its own name
RUN_FILES = ["grpo_katas/__init__.py", "grpo_katas/training/__init__.py", "grpo_katas/training/runner.py",
             "grpo_katas/training/runs.py", "grpo_katas/training/loader.py"]
RUN_ROOT, LOOP = Path("/grpo-katas"), Path("/loop")
RUN_FDS = (3, 4, 5)   # a run's events, the caller's answers and the stacks it dumps, at these numbers in every run
LOOP_FD = 6           # the loop file, open for bubblewrap to copy into the sandbox (it closes it)
RUNNER = ("import runpy, sys; sys.path.insert(0, {root!r}); "
          "runpy.run_module('grpo_katas.training.runner', run_name='__main__', alter_sys=True)")
TICK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1
# What only Linux has: /proc (a process's children, the CPU time of its tree, the signals it catches), prctl's
# death signal and an address-space limit that holds. Elsewhere (macOS) `ps` tells the children and the CPU time, and
# the rest goes without; the tests switch this off on Linux to run that path.
LINUX = sys.platform.startswith("linux")
# the device nodes the worker opens (strace of a check run, distributed calls and the brief's run included): Python
# and torch read urandom, subprocess opens null. Each is the host's node, bound in; nothing else is in /dev.
DEVICES = ("null", "urandom")


@dataclass(frozen=True)
class Limits:
    memory_gb: float = 8.0       # address space of the worker and everything it starts
    cpu_s: int = 3600            # CPU seconds over the worker's whole life (calls have their own budgets)
    threads: int = 1             # torch threads in the worker: the judge needs the other core
    disk_mb: int = 64            # the sandbox's /tmp, and the largest file the worker may write (its log too)
    tasks: int = 512             # processes and threads of the whole tree, where a cgroup holds them


_probe_cache = {}


def resolve(mode: str = "auto") -> tuple:
    """(mode, why): the sandbox to use and, when it is not bubblewrap, why not."""
    if mode == "process":
        return "process", "asked for a plain process (--sandbox process)"
    if mode not in ("auto", "bubblewrap"):
        raise ValueError(f"unknown sandbox mode {mode!r}; choose auto, bubblewrap or process")
    if "why" not in _probe_cache:
        _probe_cache["why"] = _probe()
    why = _probe_cache["why"]
    if why is None:
        return "bubblewrap", ""
    if mode == "bubblewrap":
        raise RuntimeError(f"the bubblewrap sandbox was required but cannot run: {why}")
    return "process", why


def _probe() -> str | None:
    """Why the worker's sandbox cannot run here, or None. It runs the worker's own isolation and reads back the
    capabilities a process holds inside: any at all, and the sandbox is refused."""
    if not LINUX:
        return f"bubblewrap needs Linux (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        r = subprocess.run(["bwrap", "--ro-bind", "/", "/", *isolation(Limits()), "--proc", "/proc", *devices(),
                            *read_only_root(), "cat", "/proc/self/status"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap failed to start ({exc})"
    if r.returncode != 0:
        return (f"bubblewrap cannot set up the worker's isolation here (it needs bubblewrap 0.8 or later and user "
                f"namespaces): {r.stderr.strip()[:200] or r.returncode}")
    held = capabilities(r.stdout)
    if held:
        return f"bubblewrap would leave the worker capabilities ({held}): refused"
    return None


def capabilities(status: str) -> str:
    """The nonzero capability sets in a /proc/PID/status text ("CapEff=1ff..., ..."), or "" when there are none.
    A set that cannot be read counts as held."""
    sets = dict(re.findall(r"^(Cap(?:Inh|Prm|Eff|Bnd|Amb)):\s*([0-9a-f]+)$", status, re.M))
    if len(sets) != 5:
        return "unreadable"
    return ", ".join(f"{k}={v}" for k, v in sets.items() if int(v, 16))


def isolation(limits: Limits) -> list:
    """bubblewrap's options that isolate the worker, whoever runs the judge: every namespace, no capability (as
    root, bubblewrap keeps them all unless dropped), no user namespaces of its own (where it would hold
    capabilities again), a session of its own (no TIOCSTI into the judge's terminal), an empty environment and an
    empty /tmp of limited size. The probe runs exactly these, with `devices` and `read_only_root`."""
    return ["--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--clearenv", "--size", str(limits.disk_mb * 2**20), "--tmpfs", "/tmp"]


def devices() -> list:
    """A read-only /dev that holds only DEVICES. bubblewrap's own --dev is a writable tmpfs of half the host's
    memory (with shm/, pts/, tty, full ...): a worker that writes a file there, 64 MiB at a time, fills host memory
    that no limit of its own counts."""
    args = ["--size", str(2**16), "--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    return args + ["--remount-ro", "/dev"]


def read_only_root() -> list:
    """The sandbox's root is a tmpfs that bubblewrap builds (the folders of the binds in it) and leaves writable, of
    half the host's memory like /dev: made read-only once everything is in place, the last of the options."""
    return ["--remount-ro", "/"]


def _system_binds() -> list:
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for prefix in {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), sys.prefix}:
        if not prefix.startswith("/usr"):
            args += ["--ro-bind", prefix, prefix]
    return args


def visible_paths(mode: str, targets: dict) -> dict:
    """key -> the path the worker imports the target from."""
    if mode == "process":
        return {k: str(Path(p).resolve()) for k, p in targets.items()}
    return {k: f"/targets/{i}/{Path(p).name}" for i, (k, p) in enumerate(targets.items())}


def run_path(mode: str, path: Path) -> str:
    """The path a run's loop file has inside its sandbox."""
    return str(path.resolve()) if mode == "process" else str(LOOP / path.name)


def run_command(mode: str, path: Path, runner_args: list, limits: Limits) -> list:
    """grpo_katas.training.runner on the loop file at `path`, in a run's sandbox: the runner's files and lab/ under RUN_ROOT
    and the file as LOOP/its name, all read-only, cwd an empty /tmp; its channels at RUN_FDS (see start_run). The
    file is a copy that bubblewrap writes into the sandbox's root from LOOP_FD, not a bind of it: a bind shows
    where it came from in /proc/self/mountinfo (bubblewrap's own --ro-bind-data, a random name), and a loop that
    read it there could tell a judged run from `make run`."""
    root = str(ROOT) if mode == "process" else str(RUN_ROOT)
    events, acks, stacks = RUN_FDS
    python = [sys.executable, "-I", "-c", RUNNER.format(root=root), run_path(mode, path),
              *[str(a) for a in runner_args], "--events-fd", str(events), "--ack-fd", str(acks),
              "--stack-fd", str(stacks)]
    if mode == "process":
        return python
    args = ["bwrap", *isolation(limits), *_system_binds(), "--proc", "/proc", *devices(),
            "--ro-bind", str(ROOT / "lab"), str(RUN_ROOT / "lab")]
    for f in RUN_FILES:
        args += ["--ro-bind", str(ROOT / f), str(RUN_ROOT / f)]
    args += ["--perms", "0444", "--file", str(LOOP_FD), run_path(mode, path)]
    for name, value in run_environment(limits).items():
        args += ["--setenv", name, value]
    return args + read_only_root() + ["--chdir", "/tmp", *python]


def run_environment(limits: Limits) -> dict:
    """A run's environment: the worker's, and its prints unbuffered (each reaches the caller before the step it
    was printed in ends)."""
    return {**environment(limits), "PYTHONUNBUFFERED": "1"}


def start_run(mode: str, path: Path, runner_args: list, channels: tuple, limits: Limits, **popen) -> tuple:
    """(process, the folder it runs in) of run_command, its channels (three file descriptors of the caller's: the
    events' write end, the answers' read end and the stacks' write end) given to it as RUN_FDS, in a Group of its
    own (proc.group; `kill` ends it). In process mode the folder is a fresh one, for the caller to remove; in
    bubblewrap it is the sandbox's own /tmp (None here)."""
    folder = tempfile.mkdtemp(prefix="grpo-run-") if mode == "process" else None
    fds, numbers = list(channels), RUN_FDS
    if mode != "process":
        fds, numbers = fds + [os.open(path, os.O_RDONLY | os.O_CLOEXEC)], RUN_FDS + (LOOP_FD,)

    group = Group(limits)

    def prepare():
        group.join()
        apply_limits(limits)
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]  # out of the way of the numbers first
        for fd, number in zip(high, numbers):
            os.dup2(fd, number)

    try:
        with numbers_taken(numbers):
            proc = subprocess.Popen(run_command(mode, path, runner_args, limits), pass_fds=numbers,
                                    cwd=folder or "/", env=run_environment(limits), start_new_session=True,
                                    preexec_fn=prepare, **popen)
    except BaseException:
        group.close()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        if mode != "process":
            os.close(fds[-1])
    proc.group = group
    return proc, folder


@contextlib.contextmanager
def numbers_taken(numbers: tuple):
    """Every file descriptor number in `numbers` open in this process while the block runs (/dev/null fills the
    free ones): Popen marks each number of pass_fds inheritable in the child before preexec_fn runs, and fails on
    a closed one; and the descriptors it makes for itself then never take one of them."""
    fillers = []
    try:
        while any(not is_open(n) for n in numbers):
            fillers.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        yield
    finally:
        for fd in fillers:
            os.close(fd)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def command(mode: str, targets: dict, fd: int, limits: Limits) -> list:
    root = str(ROOT) if mode == "process" else str(INSIDE)
    python = [sys.executable, "-I", "-c",
              f"import sys; sys.path.insert(0, {root!r}); "
              f"from grpo_katas.judge.worker import main; main({fd})"]
    if mode == "process":
        return python
    # The empty /tmp comes first: a later bind beneath it (a checkout or a venv under /tmp) is then not hidden.
    args = ["bwrap", *isolation(limits), *_system_binds(), "--proc", "/proc", *devices(),
            "--ro-bind", str(ROOT / "lab"), str(INSIDE / "lab")]
    for f in WORKER_FILES:
        args += ["--ro-bind", str(ROOT / f), str(INSIDE / f)]
    inside = visible_paths(mode, targets)
    for k, p in targets.items():
        args += ["--ro-bind", str(Path(p).resolve()), inside[k]]
    for name, value in environment(limits).items():
        args += ["--setenv", name, value]
    return args + read_only_root() + ["--chdir", "/tmp", *python]


def environment(limits: Limits) -> dict:
    n = str(limits.threads)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n,
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONWARNINGS": "ignore", "LANG": "C.UTF-8"}
    if "ATEN_CPU_CAPABILITY" in os.environ:  # torch's kernel path: a run's last bits, as the judge's own runs have them
        env["ATEN_CPU_CAPABILITY"] = os.environ["ATEN_CPU_CAPABILITY"]
    return env


def launch(mode: str, targets: dict, log_dir: Path, limits: Limits) -> tuple:
    """(process, the judge's end of the socket pair whose other end the worker talks on)."""
    ours, theirs = socket.socketpair()
    try:
        return _start(mode, targets, theirs.fileno(), log_dir, limits), ours
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()


def apply_limits(limits: Limits) -> None:
    """The limits of a sandboxed process, set in the child before it runs anything. macOS has no prctl and ignores
    (or refuses) an address-space limit: there the rest hold."""
    if LINUX:
        size = int(limits.memory_gb * 2**30)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # every file it writes, its own stdout log included: past this a write fails (Python ignores SIGXFSZ)
    disk = limits.disk_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
    if LINUX:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a caller that dies takes it along


def _start(mode: str, targets: dict, fd: int, log_dir: Path, limits: Limits) -> subprocess.Popen:
    out, group = open(log_dir / "worker.log", "ab"), Group(limits)

    def prepare():
        group.join()
        apply_limits(limits)

    try:
        proc = subprocess.Popen(command(mode, targets, fd, limits), pass_fds=(fd,), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, cwd=log_dir, env=environment(limits),
                                start_new_session=True, preexec_fn=prepare)
    except BaseException:
        group.close()
        raise
    finally:
        out.close()
    proc.group = group
    return proc


class Spawned:
    """A worker process started before the judge imports torch, so that both imports overlap on two cores; a
    Worker adopts it (this module needs no torch)."""

    def __init__(self, targets: dict, mode: str, limits: Limits):
        self.mode, self.why = resolve(mode)
        self.log_dir = Path(tempfile.mkdtemp(prefix="grpo-worker-"))
        self.proc, self.sock = launch(self.mode, targets, self.log_dir, limits)


def descendants(pid: int, table: dict | None = None) -> list:
    """pid and every process below it (children of every thread, recursively); without /proc, from `table`
    (processes(), read here when not given)."""
    children = None
    if not LINUX:
        children = {}
        for child, (parent, _) in (processes() if table is None else table).items():
            children.setdefault(parent, []).append(child)
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        if children is not None:
            stack += children.get(p, [])
            continue
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of pid's whole process tree, children already reaped included (on macOS as `ps -S`
    counts them; on Linux without /proc, only the living)."""
    if not LINUX:  # one `ps` for the tree and its times
        table = processes()
        return sum(table[p][1] for p in descendants(pid, table) if p in table)
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / TICK


def processes() -> dict:
    """{pid: (parent pid, CPU seconds)} of every process, from `ps` (where there is no /proc): macOS's prints the
    time as [[dd-]hh:]mm:ss.cc, summed over reaped children with -S; Linux's (procps) as [dd-]hh:mm:ss."""
    flags = ["-A", "-S"] if sys.platform == "darwin" else ["-A"]
    try:
        out = subprocess.run(["ps", *flags, "-o", "pid=", "-o", "ppid=", "-o", "time="], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    table = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].isdigit() and fields[1].isdigit():
            table[int(fields[0])] = (int(fields[1]), clock_seconds(fields[2]))
    return table


def clock_seconds(text: str) -> float:
    """'1-02:03:04' -> 93784.0, '3:04.50' -> 184.5: a time as ps prints it."""
    days, _, clock = text.rpartition("-")
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds + 86400 * int(days or 0)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the worker (or a run) and every process below it; in bubblewrap mode the PID namespace goes with it,
    and with a cgroup (proc.group) every process in it, wherever it went."""
    for p in reversed(descendants(proc.pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    if getattr(proc, "group", None) is not None:
        proc.group.close()


class Group:
    """A cgroup of a sandbox's own, where this machine lets this process make one: its whole tree's memory and
    tasks capped (cgroup v2 where the memory and pids controllers are delegated to us, else the v1 hierarchies of
    each). `held` names the caps in place; `why` says why there are none. A process joins it with `join()`, in the
    child before it runs anything (so everything it starts is in it too); `close()` kills whatever is left in it,
    removes it, and says which cap the tree ran into, if any."""

    def __init__(self, limits: Limits):
        self.folders, self.held, self.why = [], [], ""
        name = f"grpo-katas-{secrets.token_hex(6)}"
        memory, tasks = str(int(limits.memory_gb * 2**30)), str(limits.tasks)
        try:
            for version, parent, controllers in cgroup_parents():
                folder = Path(parent) / name
                folder.mkdir()
                self.folders.append(folder)
                for controller, file, value in (("memory", "memory.max" if version == 2 else "memory.limit_in_bytes",
                                                 memory), ("pids", "pids.max", tasks)):
                    if controller in controllers:
                        (folder / file).write_text(value)
                        self.held.append(controller)
        except OSError as exc:
            self.close()
            self.held, self.why = [], f"no cgroup could be made here ({exc.strerror or exc})"
        if not self.held and not self.why:
            self.why = "this machine has no memory or pids cgroup controller for us"

    def join(self) -> None:
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def reached(self) -> list:
        """The caps the tree has run into so far: "memory" (an OOM kill, or a failed charge in v1), "tasks"."""
        return sorted({cap for folder in self.folders
                       for cap, file, pattern in (("memory", "memory.events", r"^oom_kill [1-9]"),
                                                  ("memory", "memory.failcnt", r"^[1-9]"),
                                                  ("tasks", "pids.events", r"^max [1-9]"))
                       if re.search(pattern, read(folder / file), re.M)})

    def close(self) -> None:
        """Kill what is left in it (within a second), and remove it."""
        for folder in self.folders:
            for _ in range(50):
                pids = read(folder / "cgroup.procs").split()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                folder.rmdir()
        self.folders = []

    def describe(self, limits: Limits) -> str:
        caps = {"memory": f"{limits.memory_gb:g} GiB", "pids": f"{limits.tasks} tasks"}
        if not self.held:
            return f"per-process limits only: {self.why}"
        return f"each sandbox's whole tree capped at {' and '.join(caps[c] for c in self.held)} (cgroup)"


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cgroup_parents() -> list:
    """(version, the folder of this process's cgroup, the controllers a child made there gets) for cgroup v2 where
    memory and pids are delegated to it, else for each v1 hierarchy of memory and of pids."""
    if not LINUX:
        return []
    try:
        mine = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []  # no /proc: not Linux

    def mount_of(fstype: str, controller: str | None) -> str | None:
        for line in mounts:
            fields, super_options = line.split(" - ")[0].split(), line.split(" - ")[1].split()
            if super_options[0] == fstype and (controller is None or controller in super_options[2].split(",")):
                return fields[4]
        return None
    paths = {c: path for _, controllers, path in (line.split(":", 2) for line in mine) for c in controllers.split(",")}
    unified = mount_of("cgroup2", None)
    if "" in paths and unified:
        folder = unified + paths[""]
        enabled = read(Path(folder) / "cgroup.subtree_control").split()
        if "memory" in enabled and "pids" in enabled:
            return [(2, folder, ["memory", "pids"])]
    out = []
    for controller in ("memory", "pids"):
        mount = mount_of("cgroup", controller)
        if mount and controller in paths:
            out.append((1, mount + paths[controller], [controller]))
    return out
