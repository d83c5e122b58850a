"""One cgroup per job attempt, behind one small interface, for cgroup v2, cgroup v1 and no cgroups at all.

Every attempt's cgroup is `<mount>/gpupool/<name>/<allocation_id>` in each hierarchy it uses (`name` is the node's:
a simulated fleet of many nodes in one process does not collide). Operations: `create(...)` (limits, device
allow-list), `add(pid)`, `pids()` (the whole subtree: a container runtime makes sub-cgroups), `kill()` (SIGKILL
everything, one round), `wait_empty(timeout)`, `stats()`, `remove()`.

- **v2** (`V2Cgroup`), where the unified hierarchy has the memory, cpu and pids controllers: `memory.max` (and
  `memory.swap.max` 0), `cpu.max`, `pids.max`; `cgroup.kill` (or freeze + SIGKILL on kernels before 5.14);
  `memory.events` `oom_kill` (hierarchical); `cpu.stat` `usage_usec`. cgroup v2 has no device controller: the
  device allow-list is a BPF_CGROUP_DEVICE program attached to the job's directory (`devices_bpf`, loaded only
  when `devices` is given); it stays attached as long as the directory exists (agent restarts included) and the
  kernel frees it at the rmdir.
- **v1** (`V1Cgroup`): `memory.limit_in_bytes` (+ `memory.memsw.limit_in_bytes` when swap accounting exists),
  `memory.oom_control`'s `oom_kill` count (summed over the subtree: v1 counts a kill in the victim's cgroup and
  does not propagate it), `cpu.cfs_quota_us` / `cpu.cfs_period_us`, `pids.max`, `devices.deny a` then one
  `devices.allow` per rule, and the freezer for the kill (FROZEN → SIGKILL every pid in the subtree → THAWED, so
  nothing forks in between); `cpuacct.usage` for CPU time.
- **none** (`NoCgroup`): not root, or nothing mounted. The work's session (the shim makes it a session leader)
  stands in for the cgroup: a process that calls setsid() itself escapes it, and there are no limits.

Standard library only: the shim imports this module on every job's start path.
"""

from __future__ import annotations

import os
import time

try:  # the C module: `signal` builds enums, milliseconds of the shim's start on every job
    import _signal as signal
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]

TYPE_CHECKING = False  # typing itself costs the shim ~4 ms to import
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "devices", "freezer")
V2_CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000


class CgroupError(Exception):
    pass


def _record(name: str, names: str, defaults: tuple = ()) -> type:
    """A named tuple type, positional only: `collections.namedtuple` (like dataclasses) costs the shim, whose
    start path this module is on, milliseconds per job to import and build."""
    fields = tuple(names.split())
    least = len(fields) - len(defaults)

    def __new__(cls, *values):  # type: ignore[no-untyped-def]
        if not least <= len(values) <= len(fields):
            raise TypeError(f"{name} takes {least} to {len(fields)} values, not {len(values)}")
        return tuple.__new__(cls, values + defaults[len(values) - least:])

    def __repr__(self) -> str:  # type: ignore[no-untyped-def]
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in zip(fields, self, strict=True))})"

    body = {"__slots__": (), "__new__": __new__, "__repr__": __repr__, "_fields": fields,
            **{k: property(lambda self, i=i: self[i], doc=k) for i, k in enumerate(fields)}}
    return type(name, (tuple,), body)


class DeviceRule(_record("DeviceRule", "kind major minor access", defaults=("rwm",))):
    """kind "c" or "b"; major/minor None: any; access "rwm" or a part of it."""

    __slots__ = ()

    def v1(self) -> str:
        star = lambda n: "*" if n is None else str(n)  # noqa: E731
        return f"{self.kind} {star(self.major)}:{star(self.minor)} {self.access}"


# cpu_s: user + system of everything that ran in the cgroup (exited processes included); memory_bytes: charged
# now (page cache included); rss_bytes: anonymous (resident) memory now; oom_kills: OOM kills counted.
CgroupStats = _record("CgroupStats", "cpu_s memory_bytes rss_bytes oom_kills")


_NO_STATS = CgroupStats(0.0, 0, 0, 0)


# --- mounts -----------------------------------------------------------------------------------------------------
# fstype "cgroup" or "cgroup2"; options: v1's controllers (and name=...)
Mount = _record("Mount", "fstype path options")


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[Mount]:
    out = []
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3 or rparts[0] not in ("cgroup", "cgroup2"):
            continue
        out.append(Mount(rparts[0], _unescape(parts[4]), frozenset(rparts[2].split(","))))
    return out


# --- small file helpers -----------------------------------------------------------------------------------------
def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def _keyed(text: str, key: str) -> int | None:
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def _procs(directory: str) -> set[int]:
    """Processes of a cgroup and all its descendants (zombies are not listed: they left the cgroup)."""
    out: set[int] = set()
    for dirpath, _dirs, _files in os.walk(directory):
        for word in _read(os.path.join(dirpath, "cgroup.procs")).split():
            out.add(int(word))
    return out


def _rmtree_dirs(directory: str) -> bool:
    """rmdir a cgroup subtree bottom-up (cgroup dirs are removed with rmdir, never their files)."""
    if not os.path.isdir(directory):
        return True
    for dirpath, _dirs, _files in sorted(os.walk(directory), key=lambda t: -len(t[0])):
        for _ in range(50):
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY right after the last process left: try again shortly
                time.sleep(0.01)
    return not os.path.isdir(directory)


def _sigkill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --- the interface ----------------------------------------------------------------------------------------------
class JobCgroup:
    """One attempt's cgroup. Subclasses implement the hierarchy's details."""

    kind = "none"

    def descriptor(self) -> dict:
        raise NotImplementedError

    def procs_files(self) -> list[str]:
        """Files the work's first process writes its own pid into to join (before it drops privileges)."""
        return []

    def create(self, *, cpu_milli: int | None = None, memory_mib: int | None = None, pids: int | None = None,
               devices: list[DeviceRule] | None = None) -> None:
        """Make the cgroup and apply the limits; `devices` None leaves device access alone. CgroupError."""

    def add(self, pid: int) -> None:
        for path in self.procs_files():
            try:
                _write(path, str(pid))
            except OSError as e:
                raise CgroupError(f"cannot move {pid} into {path}: {e}") from e

    def pids(self) -> set[int]:
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL every process in the cgroup, one round (call wait_empty, or use `emptying`, to be sure)."""
        _sigkill_all(self.pids())

    def wait_empty(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        delay = 0.002
        while self.pids():
            if time.monotonic() >= end:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

    def stats(self) -> CgroupStats:
        return _NO_STATS

    def remove(self) -> bool:
        return True

    def exists(self) -> bool:
        return False


class V1Cgroup(JobCgroup):
    kind = "v1"

    def __init__(self, dirs: dict[str, str], others: list[str]) -> None:
        self.dirs = dirs  # controller → this attempt's directory in that controller's hierarchy
        self.others = others  # the same path in hierarchies we do not manage (a container runtime fills them)

    def descriptor(self) -> dict:
        return {"kind": "v1", "dirs": dict(self.dirs), "others": list(self.others)}

    def _primary(self) -> str | None:
        for c in ("freezer", "pids", "memory", "cpuacct", "devices", "cpu"):
            if c in self.dirs:
                return self.dirs[c]
        return None

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def create(self, *, cpu_milli=None, memory_mib=None, pids=None, devices=None) -> None:
        try:
            for d in dict.fromkeys(self.dirs.values()):
                os.makedirs(d, exist_ok=True)
            if memory_mib is not None:
                self._need("memory")
                limit = str(int(memory_mib) * 1024 * 1024)
                _write(os.path.join(self.dirs["memory"], "memory.limit_in_bytes"), limit)
                memsw = os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):  # RAM + swap = RAM: the work cannot swap past its limit
                    _write(memsw, limit)
            if cpu_milli is not None:
                self._need("cpu")
                _write(os.path.join(self.dirs["cpu"], "cpu.cfs_period_us"), str(CFS_PERIOD_US))
                quota = max(1000, int(cpu_milli) * CFS_PERIOD_US // 1000)
                _write(os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"), str(quota))
            if pids is not None:
                self._need("pids")
                _write(os.path.join(self.dirs["pids"], "pids.max"), str(int(pids)))
            if devices is not None:
                self._need("devices")
                d = self.dirs["devices"]
                _write(os.path.join(d, "devices.deny"), "a")
                for rule in devices:
                    _write(os.path.join(d, "devices.allow"), rule.v1())
        except OSError as e:
            raise CgroupError(f"cgroup v1 setup failed: {e}") from e

    def _need(self, controller: str) -> None:
        if controller not in self.dirs:
            raise CgroupError(f"the {controller} controller is not mounted (cgroup v1)")

    def pids(self) -> set[int]:
        primary = self._primary()
        return _procs(primary) if primary else set()

    def kill(self) -> None:
        freezer = self.dirs.get("freezer")
        if freezer is None or not os.path.isdir(freezer):
            _sigkill_all(self.pids())
            return
        state = os.path.join(freezer, "freezer.state")
        try:
            _write(state, "FROZEN")
            end = time.monotonic() + 0.2  # a task in uninterruptible sleep can keep it FREEZING: kill anyway
            while _read(state).strip() != "FROZEN" and time.monotonic() < end:
                time.sleep(0.001)
            _sigkill_all(_procs(freezer))
        except OSError:
            _sigkill_all(self.pids())
        finally:
            try:
                _write(state, "THAWED")
            except OSError:
                pass

    def stats(self) -> CgroupStats:
        cpu_ns = 0
        if "cpuacct" in self.dirs:
            cpu_ns = int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"), "0").strip() or 0)
        mem = self.dirs.get("memory")
        if mem is None:
            return CgroupStats(cpu_ns / 1e9, 0, 0, 0)
        usage = int(_read(os.path.join(mem, "memory.usage_in_bytes"), "0").strip() or 0)
        stat = _read(os.path.join(mem, "memory.stat"))
        rss = _keyed(stat, "total_rss")
        rss = _keyed(stat, "rss") if rss is None else rss
        ooms = 0
        for dirpath, _dirs, _files in os.walk(mem):
            ooms += _keyed(_read(os.path.join(dirpath, "memory.oom_control")), "oom_kill") or 0
        return CgroupStats(cpu_ns / 1e9, usage, rss or 0, ooms)

    def remove(self) -> bool:
        ok = True
        for d in dict.fromkeys(list(self.dirs.values()) + self.others):
            ok = _rmtree_dirs(d) and ok
        return ok

    def exists(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs.values())


class V2Cgroup(JobCgroup):
    kind = "v2"

    def __init__(self, directory: str, mount: str) -> None:
        self.dir = directory
        self.mount = mount

    def descriptor(self) -> dict:
        return {"kind": "v2", "dir": self.dir, "mount": self.mount}

    def procs_files(self) -> list[str]:
        return [os.path.join(self.dir, "cgroup.procs")]

    def create(self, *, cpu_milli=None, memory_mib=None, pids=None, devices=None) -> None:
        try:
            self._enable_controllers()
            os.makedirs(self.dir, exist_ok=True)
            if memory_mib is not None:
                _write(os.path.join(self.dir, "memory.max"), str(int(memory_mib) * 1024 * 1024))
                swap = os.path.join(self.dir, "memory.swap.max")
                if os.path.exists(swap):
                    _write(swap, "0")
            if cpu_milli is not None:
                quota = max(1000, int(cpu_milli) * CFS_PERIOD_US // 1000)
                _write(os.path.join(self.dir, "cpu.max"), f"{quota} {CFS_PERIOD_US}")
            if pids is not None:
                _write(os.path.join(self.dir, "pids.max"), str(int(pids)))
            if devices is not None:  # no v2 devices controller: a BPF_CGROUP_DEVICE program (before anyone joins)
                from services.agent.executor import devices_bpf  # ctypes: not on the shim's start path

                devices_bpf.attach(self.dir, devices)  # BpfError is an OSError: errno and the verifier's log
        except OSError as e:
            raise CgroupError(f"cgroup v2 setup failed: {e}") from e

    def _enable_controllers(self) -> None:
        """Each ancestor between the mount and the job must delegate the controllers to its children."""
        available = set(_read(os.path.join(self.mount, "cgroup.controllers")).split())
        wanted = [c for c in V2_CONTROLLERS if c in available]
        chain = [self.mount]
        for part in os.path.relpath(os.path.dirname(self.dir), self.mount).split(os.sep):
            chain.append(os.path.join(chain[-1], part))
        for path in chain:
            os.makedirs(path, exist_ok=True)
            enabled = set(_read(os.path.join(path, "cgroup.subtree_control")).split())
            missing = [c for c in wanted if c not in enabled]
            if missing:
                _write(os.path.join(path, "cgroup.subtree_control"), " ".join("+" + c for c in missing))

    def pids(self) -> set[int]:
        return _procs(self.dir)

    def kill(self) -> None:
        kill_file = os.path.join(self.dir, "cgroup.kill")
        if os.path.exists(kill_file):
            try:
                _write(kill_file, "1")  # atomic for the whole subtree, forks included
                return
            except OSError:
                pass
        freeze = os.path.join(self.dir, "cgroup.freeze")
        try:
            _write(freeze, "1")
            _sigkill_all(self.pids())
        except OSError:
            _sigkill_all(self.pids())
        finally:
            try:
                _write(freeze, "0")
            except OSError:
                pass

    def stats(self) -> CgroupStats:
        usage_us = _keyed(_read(os.path.join(self.dir, "cpu.stat")), "usage_usec") or 0
        current = int(_read(os.path.join(self.dir, "memory.current"), "0").strip() or 0)
        anon = _keyed(_read(os.path.join(self.dir, "memory.stat")), "anon") or 0
        ooms = _keyed(_read(os.path.join(self.dir, "memory.events")), "oom_kill") or 0
        return CgroupStats(usage_us / 1e6, current, anon, ooms)

    def remove(self) -> bool:
        # The rmdir detaches and frees the device program (no fd of it is held); a cgroup that cannot go keeps it.
        return _rmtree_dirs(self.dir)

    def exists(self) -> bool:
        return os.path.isdir(self.dir)


class NoCgroup(JobCgroup):
    """No cgroup: the work's session stands in for it (`sid` is the work's main pid once it started)."""

    def __init__(self, sid: int | None = None) -> None:
        self.sid = sid

    def descriptor(self) -> dict:
        return {"kind": "none", "sid": self.sid}

    def pids(self) -> set[int]:
        return {pid for pid, _stat in _session(self.sid)} if self.sid else set()

    def stats(self) -> CgroupStats:
        """CPU of the session's live processes (what exited is not counted: the shim's rusage covers it at the
        end) and their resident memory; from a /proc scan shared by all sessions for 0.5 s (a simulated fleet
        asks for the usage of every allocation every second)."""
        if not self.sid:
            return _NO_STATS
        tick = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        cpu, rss = 0.0, 0
        for fields in _sessions(0.5).get(self.sid, ()):
            cpu += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
            rss += int(fields[21]) * page
        return CgroupStats(cpu, rss, rss, 0)


def _proc_stats() -> Iterator[tuple[int, list[str]]]:
    """Every live process: (pid, /proc/<pid>/stat fields after the command name, state first)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        raw = _read(f"/proc/{name}/stat")
        fields = raw[raw.rfind(")") + 2:].split()
        if len(fields) > 21 and fields[0] not in ("Z", "X"):
            yield int(name), fields


def _session(sid: int) -> Iterator[tuple[int, list[str]]]:
    return ((pid, fields) for pid, fields in _proc_stats() if int(fields[3]) == sid)


_SCAN: list = [0.0, {}]  # (monotonic time, {sid: [fields, ...]})


def _sessions(max_age: float) -> dict[int, list[list[str]]]:
    if time.monotonic() - _SCAN[0] > max_age:
        by_sid: dict[int, list[list[str]]] = {}
        for _pid, fields in _proc_stats():
            by_sid.setdefault(int(fields[3]), []).append(fields)
        _SCAN[:] = [time.monotonic(), by_sid]
    return _SCAN[1]


# --- detection --------------------------------------------------------------------------------------------------
class CgroupSystem:
    """What this machine offers: `kind` "v2", "v1" or "none" (`why` says why not better)."""

    def __init__(self, kind: str, why: str, *, v1: dict[str, str] | None = None, others: list[str] | None = None,
                 v2: str | None = None) -> None:
        self.kind, self.why = kind, why
        self._v1 = v1 or {}
        self._others = others or []
        self._v2 = v2

    def base(self, name: str) -> list[str]:
        """The node's parent directories (`gpupool/<name>`) in every hierarchy this system uses."""
        if self.kind == "v2" and self._v2:
            return [os.path.join(self._v2, "gpupool", name)]
        return [os.path.join(m, "gpupool", name) for m in dict.fromkeys(self._v1.values())]

    def release_node(self, name: str) -> None:
        """Remove the node's parent directories where they are empty (a job's cgroup left in one keeps it): an
        executor that goes away leaves no empty cgroups behind, however many state dirs came and went."""
        others = [os.path.join(m, "gpupool", name) for m in self._others] if self.kind == "v1" else []
        for base in self.base(name) + others:
            try:
                os.rmdir(base)
            except OSError:
                pass

    def job(self, name: str, allocation_id: str) -> JobCgroup:
        rel = os.path.join("gpupool", name, allocation_id)
        if self.kind == "v2" and self._v2:
            return V2Cgroup(os.path.join(self._v2, rel), self._v2)
        if self.kind == "v1":
            return V1Cgroup({c: os.path.join(m, rel) for c, m in self._v1.items()},
                            [os.path.join(m, rel) for m in self._others])
        return NoCgroup()

    def jobs(self, name: str) -> set[str]:
        """Allocation ids that have a cgroup of this node now (to find ones nobody remembers)."""
        out: set[str] = set()
        for base in self.base(name):
            try:
                out.update(e for e in os.listdir(base) if os.path.isdir(os.path.join(base, e)))
            except OSError:
                pass
        return out


def detect(mode: str = "auto", mountinfo: str = "/proc/self/mountinfo") -> CgroupSystem:
    """mode "auto" picks v2 where the unified hierarchy has memory, cpu and pids, else v1 where memory is mounted,
    else none; "v1", "v2" and "none" force one (a forced v2 uses the unified mount even without controllers)."""
    if mode == "none":
        return CgroupSystem("none", "cgroups disabled by configuration")
    if os.geteuid() != 0:
        return CgroupSystem("none", "not root: cannot create cgroups")
    mounts = cgroup_mounts(mountinfo)
    unified = next((m.path for m in mounts if m.fstype == "cgroup2"), None)
    v1: dict[str, str] = {}
    others: list[str] = []
    for m in mounts:
        if m.fstype != "cgroup":
            continue
        mine = [c for c in V1_CONTROLLERS if c in m.options and c not in v1]
        for c in mine:
            v1[c] = m.path
        if not mine and m.path not in others:
            others.append(m.path)
    if unified and mode in ("auto", "v2"):
        have = set(_read(os.path.join(unified, "cgroup.controllers")).split())
        if mode == "v2":
            return CgroupSystem("v2", "", v2=unified)
        if set(V2_CONTROLLERS) <= have:
            problem = _v2_unusable(unified)
            if problem:
                return CgroupSystem("none", problem)
            return CgroupSystem("v2", "", v2=unified)
    if mode in ("auto", "v1") and "memory" in v1:
        problem = _v1_unusable(v1) if mode == "auto" else None
        if problem:
            return CgroupSystem("none", problem)
        if unified:
            others.append(unified)
        why = "" if unified is None else "the unified hierarchy lacks memory/cpu/pids: using cgroup v1"
        return CgroupSystem("v1", why, v1=v1, others=[o for o in others if o not in v1.values()])
    return CgroupSystem("none", f"no usable cgroup hierarchy for mode {mode!r}")


def _v1_unusable(v1: dict[str, str]) -> str | None:
    """A read-only cgroupfs (a container's default) would fail every launch: say so at detection instead."""
    for mount in dict.fromkeys(v1.values()):
        try:
            os.makedirs(os.path.join(mount, "gpupool"), exist_ok=True)
        except OSError as e:
            return f"cgroup v1 at {mount} is not writable: {e}"
    return None


def _v2_unusable(unified: str) -> str | None:
    """The controllers must be delegated from the mount down to gpupool/ (fails e.g. in a container whose cgroup
    namespace root holds processes: the no-internal-processes rule)."""
    try:
        V2Cgroup(os.path.join(unified, "gpupool", "probe"), unified)._enable_controllers()
    except OSError as e:
        return f"cgroup v2 controllers cannot be delegated below {unified}: {e}"
    return None


def from_descriptor(d: dict) -> JobCgroup:
    if d.get("kind") == "v1":
        return V1Cgroup(dict(d["dirs"]), list(d.get("others", [])))
    if d.get("kind") == "v2":
        return V2Cgroup(d["dir"], d["mount"])
    return NoCgroup(d.get("sid"))


# --- helpers shared by the shim and the executor ----------------------------------------------------------------
def exe_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    return _read(f"/proc/{pid}/comm").strip()


def is_launcher(pid: int, launchers: Iterable[str]) -> bool:
    """A launcher (bwrap, podman, conmon, runc, catatonit) is not the work: it gets no stop or warn signal, and
    the work has started once some process of the cgroup is not one. By the executable's basename, or by the
    command name: `runc init` runs from a memfd copy of runc whose path reads as "/" once it pivoted into the
    container's root."""
    names = set(launchers)
    if not names:
        return False
    exe = exe_of(pid)
    base = os.path.basename(exe.split(" (deleted)")[0])
    comm = _comm(pid)
    if base in names or comm in names or exe in ("", "/"):
        return True
    return "runc" in names and ("runc" in exe or comm.startswith("runc"))


def signal_work(cg: JobCgroup, signum: int, launchers: Iterable[str] = ()) -> int:
    """Send `signum` to every process of the cgroup except launchers; how many got it."""
    launchers = tuple(launchers)
    sent = 0
    for pid in cg.pids():
        if is_launcher(pid, launchers):
            continue
        try:
            os.kill(pid, signum)
            sent += 1
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def emptying(cg: JobCgroup, launchers: Iterable[str] = (), grace_s: float = 1.0) -> Iterator[float]:
    """Kill the cgroup's processes until it is empty, yielding how long to wait before the next look (the caller
    sleeps — time.sleep in the shim, asyncio.sleep in the executor — and bounds the total). With launchers the
    work is killed first and the launchers get `grace_s` to notice and clean up after themselves (podman removes
    its container record), then everything left is killed."""
    launchers = tuple(launchers)
    start = time.monotonic()
    delay = 0.002
    while True:
        pids = cg.pids()
        if not pids:
            return
        if launchers and time.monotonic() - start < grace_s:
            _sigkill_all(p for p in pids if not is_launcher(p, launchers))
        else:
            cg.kill()
        yield delay
        delay = min(delay * 2, 0.05)
