"""How the work is isolated: one interface, three drivers.

- `process`: the command itself, in its own session and the job cgroup (limits, device allow-list on v1).
- `sandbox`: bubblewrap — own PID, IPC and mount namespaces (the network is the host's), the host's root
  read-only, a fresh /proc, a minimal /dev with only the granted NVIDIA device nodes (and the control nodes that
  exist) bound in, a private /tmp and /dev/shm, the workdir and checkpoint dir read-write. bwrap runs as the job's
  unprivileged uid (it then makes a user namespace itself); it is never the work's parent's child with
  --die-with-parent, so the work survives an agent restart.
- `container`: `podman --runtime runc run --rm` of an image the node already has (never pulled) or of a `--rootfs`
  directory, host network, read-only root with a private /tmp, the same binds, `--device` for only the granted
  devices, the job's uid inside, `--cgroup-parent` = the job's cgroup, so podman, conmon and the container all run
  in the job cgroup's subtree and kill()/pids() cover them.

A driver says whether it can run here (`available`), checks a spec before anything starts (`preflight`, raising
LaunchError), and gives the shim what to exec (`argv`, `exec_env`, `runs_as`)."""

from __future__ import annotations

import os
import re
import resource
import shutil
import stat
import subprocess
from dataclasses import dataclass

from services.agent.executor.cgroups import DeviceRule
from services.agent.executor.spec import LaunchError, LaunchSpec

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Always allowed: null, zero, full, random, urandom, tty, ptmx and the pty slaves.
STANDARD_DEVICES = (DeviceRule("c", 1, 3), DeviceRule("c", 1, 5), DeviceRule("c", 1, 7), DeviceRule("c", 1, 8),
                    DeviceRule("c", 1, 9), DeviceRule("c", 5, 0), DeviceRule("c", 5, 2), DeviceRule("c", 136, None))
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255


@dataclass(frozen=True, slots=True)
class Paths:
    state_dir: str
    attempt_dir: str
    workdir: str
    checkpoint_dir: str
    control_dir: str  # read-only for the work: holds the stop deadline file
    deadline_file: str
    cgroup_parent: str | None  # the job cgroup relative to the hierarchy roots ("/gpupool/<node>/<alloc>")
    container_name: str


@dataclass(frozen=True, slots=True)
class Device:
    path: str  # on the host (in spec.device_dir)
    dest: str  # where the work sees it (/dev/...)
    rule: DeviceRule
    present: bool  # False: no node there (a simulated node); the rule is still made by number, nothing is bound


def _rule(path: str, default: DeviceRule | None) -> tuple[DeviceRule | None, bool]:
    try:
        st = os.stat(path)
    except OSError:
        return default, False
    if not stat.S_ISCHR(st.st_mode):
        return default, False
    return DeviceRule("c", os.major(st.st_rdev), os.minor(st.st_rdev)), True


def gpu_devices(spec: LaunchSpec) -> list[Device]:
    """Exactly the granted /dev/nvidia<i>, plus nvidiactl, nvidia-uvm, nvidia-uvm-tools and nvidia-caps/* (the
    last three only where they exist: their majors are dynamic)."""
    dd = spec.device_dir
    out = []
    for i in sorted(set(spec.gpu_indices)):
        rule, present = _rule(os.path.join(dd, f"nvidia{i}"), DeviceRule("c", NVIDIA_MAJOR, i))
        out.append(Device(os.path.join(dd, f"nvidia{i}"), f"/dev/nvidia{i}", rule, present))
    ctl, present = _rule(os.path.join(dd, "nvidiactl"), DeviceRule("c", NVIDIA_MAJOR, NVIDIACTL_MINOR))
    out.append(Device(os.path.join(dd, "nvidiactl"), "/dev/nvidiactl", ctl, present))
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        rule, present = _rule(os.path.join(dd, name), None)
        if rule is not None:
            out.append(Device(os.path.join(dd, name), f"/dev/{name}", rule, present))
    caps = os.path.join(dd, "nvidia-caps")
    for name in sorted(os.listdir(caps)) if os.path.isdir(caps) else []:
        rule, present = _rule(os.path.join(caps, name), None)
        if rule is not None:
            out.append(Device(os.path.join(caps, name), f"/dev/nvidia-caps/{name}", rule, present))
    return out


def device_rules(spec: LaunchSpec, extra: tuple[DeviceRule, ...] = ()) -> list[DeviceRule]:
    return list(STANDARD_DEVICES) + [d.rule for d in gpu_devices(spec)] + list(extra)


def executable(path: str, uid: int, gid: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if uid == 0:
        return bool(st.st_mode & 0o111)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    return bool(st.st_mode & bit)


def resolve(command: str, path_env: str | None, uid: int, gid: int, root: str = "/") -> str | None:
    """argv[0] → the absolute path that would be exec'd (PATH search as execvp does), or None."""
    def inside(p: str) -> str:
        return os.path.join(root, p.lstrip("/")) if root != "/" else p

    if "/" in command:
        return command if executable(inside(command), uid, gid) else None
    for d in (path_env or DEFAULT_PATH).split(":"):
        candidate = os.path.join(d or ".", command)
        if d.startswith("/") and executable(inside(candidate), uid, gid):
            return candidate
    return None


class Driver:
    name = ""
    launchers: tuple[str, ...] = ()  # exe basenames that are not the work (no stop signal, started = gone)
    setup_failure: tuple[dict, ...] = ()  # how the launcher says it failed before the work started
    extra_devices: tuple[DeviceRule, ...] = ()
    _available: tuple[bool, str] | None = None  # the probe's answer, asked once per driver

    def available(self) -> tuple[bool, str]:
        if self._available is None:
            self._available = self._probe()
        return self._available

    def _probe(self) -> tuple[bool, str]:
        return True, ""

    def preflight(self, spec: LaunchSpec, uid: int, gid: int) -> str:
        """Check the spec; returns argv[0] resolved. LaunchError."""
        found = resolve(spec.argv[0], spec.env.get("PATH"), uid, gid)
        if found is None:
            raise LaunchError("CommandNotFound", f"{spec.argv[0]!r} is not an executable file on PATH "
                                                 f"{spec.env.get('PATH') or DEFAULT_PATH!r} for uid {uid}")
        return found

    def argv(self, spec: LaunchSpec, paths: Paths, command: str) -> list[str]:
        return [command, *spec.argv[1:]]

    def exec_path(self, spec: LaunchSpec, command: str) -> str:
        return command

    def exec_env(self, spec: LaunchSpec, paths: Paths, env: dict[str, str]) -> dict[str, str]:
        return env

    def runs_as(self, uid: int, gid: int) -> tuple[int | None, int | None]:
        return uid, gid

    def exec_cwd(self, paths: Paths) -> str:
        return paths.workdir

    def launch_error(self, failure: dict) -> LaunchError:
        return LaunchError("LaunchFailed", failure.get("message", "the launcher failed"))

    def cleanup_command(self, paths: Paths) -> tuple[list[str], dict[str, str]] | None:
        """What to run (argv, env) after a forced kill to tidy the launcher's own records."""
        return None


class ProcessDriver(Driver):
    name = "process"

    def argv(self, spec: LaunchSpec, paths: Paths, command: str) -> list[str]:
        return list(spec.argv)  # argv[0] as given; the shim execs the resolved path


class SandboxDriver(Driver):
    name = "sandbox"
    launchers = ("bwrap",)
    setup_failure = ({"codes": [1], "stderr_prefix": "bwrap: "},)

    def __init__(self, bwrap: str | None = None) -> None:
        self.bwrap = bwrap or shutil.which("bwrap") or ""

    def _probe(self) -> tuple[bool, str]:
        if not self.bwrap:
            return False, "bubblewrap (bwrap) is not installed"
        as_nobody = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
        try:
            r = subprocess.run([self.bwrap, "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "--dev",
                                "/dev", "true"], capture_output=True, timeout=10, **as_nobody)
        except (OSError, subprocess.SubprocessError) as e:
            return False, f"bwrap cannot run: {e}"
        if r.returncode != 0:
            return False, f"bwrap cannot make a sandbox here: {r.stderr.decode(errors='replace').strip()}"
        return True, ""

    def preflight(self, spec: LaunchSpec, uid: int, gid: int) -> str:
        ok, why = self.available()
        if not ok:
            raise LaunchError("DriverUnavailable", why)
        if uid == 0:
            raise LaunchError("LaunchFailed", "the sandbox runs work unprivileged: uid 0 is refused")
        return super().preflight(spec, uid, gid)

    def exec_path(self, spec: LaunchSpec, command: str) -> str:
        return self.bwrap

    def argv(self, spec: LaunchSpec, paths: Paths, command: str) -> list[str]:
        out = [self.bwrap, "--unshare-pid", "--unshare-ipc", "--ro-bind", "/", "/", "--proc", "/proc",
               "--dev", "/dev", "--tmpfs", "/dev/shm"]
        for dev in gpu_devices(spec):
            if dev.present:
                out += ["--dev-bind", dev.path, dev.dest]
        out += ["--tmpfs", "/tmp",
                "--bind", paths.workdir, paths.workdir,
                "--bind", paths.checkpoint_dir, paths.checkpoint_dir,
                "--ro-bind", paths.control_dir, paths.control_dir,
                "--chdir", paths.workdir, "--", command, *spec.argv[1:]]
        return out

    def launch_error(self, failure: dict) -> LaunchError:
        message = failure.get("message", "")
        if "execvp" in message:
            return LaunchError("CommandNotFound", message)
        return LaunchError("SandboxFailed", message or "bwrap failed to set up the sandbox")


class ContainerDriver(Driver):
    name = "container"
    launchers = ("podman", "conmon", "runc", "catatonit", "podman-init")
    # podman's own errors, and catatonit's (--init) when it cannot exec the command
    setup_failure = ({"codes": [125, 126, 127], "stderr_prefix": "Error: "},
                     {"codes": [1, 127], "stderr_prefix": "ERROR (catatonit"})
    # runc writes its default device rules into the container's cgroup, a child of the job's: the job's allow-list
    # must include them or runc fails (EPERM). mknod of any node (opening still needs r/w), console, tun, fuse.
    extra_devices = (DeviceRule("c", None, None, "m"), DeviceRule("b", None, None, "m"), DeviceRule("c", 5, 1),
                     DeviceRule("c", 10, 200), DeviceRule("c", 10, 229))

    def __init__(self, state_dir: str, cgroups_kind: str, podman: str | None = None,
                 runc: str | None = None) -> None:
        self.podman = podman or shutil.which("podman") or ""
        self.runc = runc or shutil.which("runc") or next(
            (p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.path.exists(p)), "")
        self.conf = os.path.join(state_dir, "podman", "containers.conf")
        self.cgroups_kind = cgroups_kind

    def _probe(self) -> tuple[bool, str]:
        if not self.podman or not self.runc:
            return False, "podman and runc are not both installed"
        if os.geteuid() != 0:
            return False, "the container driver needs root (rootful podman with the cgroupfs manager)"
        if self.cgroups_kind == "none":
            return False, "the container driver needs cgroups (the container must run inside the job cgroup)"
        self._write_conf()
        try:
            r = subprocess.run(self._podman("info", "--format", "{{.Host.CgroupsVersion}}"), capture_output=True,
                               timeout=30, env=self._env())
        except (OSError, subprocess.SubprocessError) as e:
            return False, f"podman cannot run: {e}"
        if r.returncode != 0:
            return False, f"podman info failed: {r.stderr.decode(errors='replace').strip()[-300:]}"
        return True, ""

    def _write_conf(self) -> None:
        """podman's default rlimits (nofile 1048576) exceed what a process without CAP_SYS_RESOURCE may set, and
        podman 4.3 ignores --ulimit over its defaults: give it defaults within our own hard limits."""
        def within(kind: int, want: int) -> int:
            hard = resource.getrlimit(kind)[1]
            return want if hard == resource.RLIM_INFINITY else min(want, hard)

        nofile, nproc = within(resource.RLIMIT_NOFILE, 1048576), within(resource.RLIMIT_NPROC, 32768)
        os.makedirs(os.path.dirname(self.conf), exist_ok=True)
        text = f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        tmp = self.conf + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.conf)

    def _env(self) -> dict[str, str]:
        return {"PATH": DEFAULT_PATH, "CONTAINERS_CONF": self.conf, "HOME": "/root"}

    def _podman(self, *args: str) -> list[str]:
        return [self.podman, "--runtime", self.runc, "--cgroup-manager", "cgroupfs", *args]

    def preflight(self, spec: LaunchSpec, uid: int, gid: int) -> str:
        ok, why = self.available()
        if not ok:
            raise LaunchError("DriverUnavailable", why)
        if bool(spec.image) == bool(spec.rootfs):
            raise LaunchError("LaunchFailed", "the container driver needs exactly one of image and rootfs")
        if spec.rootfs:
            if not os.path.isdir(spec.rootfs):
                raise LaunchError("ImagePullFailed", f"rootfs {spec.rootfs!r} is not a directory on this node")
            found = resolve(spec.argv[0], spec.env.get("PATH"), uid, gid, root=spec.rootfs)
            if found is None:
                raise LaunchError("CommandNotFound", f"{spec.argv[0]!r} is not an executable file in the rootfs")
            return found
        r = subprocess.run(self._podman("image", "exists", spec.image), capture_output=True, timeout=60,
                           env=self._env())
        if r.returncode != 0:
            raise LaunchError("ImagePullFailed", f"image {spec.image!r} is not present on this node "
                                                 "(images are never pulled by the executor)")
        return spec.argv[0]

    def exec_path(self, spec: LaunchSpec, command: str) -> str:
        return self.podman

    def exec_env(self, spec: LaunchSpec, paths: Paths, env: dict[str, str]) -> dict[str, str]:
        return self._env()

    def runs_as(self, uid: int, gid: int) -> tuple[int | None, int | None]:
        return None, None  # podman runs as root; the work runs as uid:gid inside (--user)

    def exec_cwd(self, paths: Paths) -> str:
        return paths.attempt_dir  # podman's; the work's is -w

    def env_file(self, paths: Paths) -> str:
        return os.path.join(paths.attempt_dir, "container.env")

    def write_env(self, paths: Paths, env: dict[str, str]) -> list[str]:
        """The work's environment in an env file (not on the command line, where `ps` shows it); values with a
        newline, which the file cannot hold, are returned as --env arguments."""
        lines, args = [], []
        for k, v in env.items():
            if "\n" in v or "\r" in v:
                args += ["--env", f"{k}={v}"]
            else:
                lines.append(f"{k}={v}\n")
        fd = os.open(self.env_file(paths), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
        return args

    def argv(self, spec: LaunchSpec, paths: Paths, command: str, env_args: list[str] = ()) -> list[str]:
        uid, gid = spec.uid, spec.gid
        out = self._podman("run", "--rm", "--name", paths.container_name, "--network", "host", "--pull", "never",
                           "--cgroup-parent", paths.cgroup_parent or "", "--log-driver", "passthrough",
                           "--pids-limit", "-1", "--init", "--user", f"{uid}:{gid}", "--read-only",
                           "-v", f"{paths.workdir}:{paths.workdir}:rw",
                           "-v", f"{paths.checkpoint_dir}:{paths.checkpoint_dir}:rw",
                           "-v", f"{paths.control_dir}:{paths.control_dir}:ro", "-w", paths.workdir,
                           "--env-file", self.env_file(paths), *env_args)
        for dev in gpu_devices(spec):
            if dev.present:
                out += ["--device", f"{dev.path}:{dev.dest}:rwm"]
        out += ["--rootfs", spec.rootfs] if spec.rootfs else [spec.image]
        return out + [command, *spec.argv[1:]]

    def launch_error(self, failure: dict) -> LaunchError:
        message = failure.get("message", "")
        if failure.get("exit_code") == 127 or re.search(r"executable file not found|no such file", message, re.I):
            return LaunchError("CommandNotFound", message)
        if re.search(r"image not known|unable to find image", message, re.I):
            return LaunchError("ImagePullFailed", message)
        return LaunchError("LaunchFailed", f"the container did not start: {message}")

    def cleanup_command(self, paths: Paths) -> tuple[list[str], dict[str, str]] | None:
        """After a forced kill podman may keep the container's record: remove it (never the work: that is gone)."""
        return self._podman("rm", "--force", "--ignore", "--time", "0", paths.container_name), self._env()


def make_drivers(state_dir: str, cgroups_kind: str) -> dict[str, Driver]:
    return {"process": ProcessDriver(), "sandbox": SandboxDriver(),
            "container": ContainerDriver(state_dir, cgroups_kind)}
