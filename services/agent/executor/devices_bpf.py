"""The device allow-list on cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program attached to the job's cgroup.

cgroup v2 has no devices controller. The kernel instead runs every BPF_CGROUP_DEVICE program attached to a
process's v2 cgroup and to its ancestors on each device open and mknod (`devcgroup_check_permission`); all of them
must return 1. This module assembles such a program by hand from a list of `DeviceRule`s, loads it and attaches it
with the bpf(2) syscall through ctypes — standard library only, no libbpf, no compiler.

The program reads `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }` (r1 points at it),
`access_type` = access << 16 | type (type: block 1, char 2; access: mknod 1, read 2, write 4), and returns 1 when
one rule matches: same type (or kind "a"), same major and minor (None: any), and the rule's access covers every
requested bit (the v1 devices controller's semantics). Anything else returns 0: the open or mknod fails EPERM.

Lifetime: the program's fd is closed right after the attach. An attachment holds its own reference, so the
program lives exactly as long as it is attached, and the attachment lives as long as the cgroup directory: the
work stays confined across an agent restart (nothing in the agent holds it) and the kernel detaches and frees the
program when the directory is removed (rmdir). A cgroup that cannot be removed (a process survived) keeps its
program. `detach()` exists for callers that reuse a directory; `attach()` calls it to replace a stale program of
ours left on a reused directory (new one first: there is no moment without a program).

Attach flags: BPF_F_ALLOW_MULTI, so that a container runtime can attach its own program to the job's sub-cgroups
(runc does); the kernel then runs both and both must allow. A program attached to an ancestor without
ALLOW_MULTI/OVERRIDE makes our attach fail (EPERM): that is reported, not worked around.

License string "GPL": the kernel demands a GPL-compatible license only of programs that call GPL-only helpers;
this one calls no helper, so any string loads. It is still "GPL" so that a kernel or LSM policy that checks it
never refuses the program (the project's own Apache-2.0 licence is not GPL-compatible in the kernel's list).

Errors are `BpfError` (an OSError: errno, the operation, and the verifier's log for a refused program). The
syscall number is the architecture's (x86_64 321, aarch64 280); other architectures raise ENOSYS.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno as _errno
import os
import platform
import resource
import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# bpf(2) commands, program and attach types, flags (include/uapi/linux/bpf.h)
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_MULTI = 2

BPF_DEVCG_DEV_BLOCK = 1
BPF_DEVCG_DEV_CHAR = 2
BPF_DEVCG_ACC_MKNOD = 1
BPF_DEVCG_ACC_READ = 2
BPF_DEVCG_ACC_WRITE = 4
_ACCESS_BITS = {"m": BPF_DEVCG_ACC_MKNOD, "r": BPF_DEVCG_ACC_READ, "w": BPF_DEVCG_ACC_WRITE}
_ALL_ACCESS = BPF_DEVCG_ACC_MKNOD | BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE
_TYPES = {"c": BPF_DEVCG_DEV_CHAR, "b": BPF_DEVCG_DEV_BLOCK, "a": None}

PROG_NAME = b"gpupool_devices"  # at most 15 bytes (BPF_OBJ_NAME_LEN 16 with the NUL): how ours are recognised
LICENSE = b"GPL"
_SYSCALL = {"x86_64": 321, "amd64": 321, "aarch64": 280, "arm64": 280}
_LOG_SIZE = 256 * 1024


class BpfError(OSError):
    """A bpf(2) call failed: `errno`, `op` (the command), `log` (the verifier's output for a refused program)."""

    def __init__(self, err: int, op: str, detail: str = "", log: str = "") -> None:
        message = f"bpf {op} failed: {os.strerror(err)} ({_errno.errorcode.get(err, err)})"
        if detail:
            message += f": {detail}"
        if log.strip():
            message += "; verifier log:\n" + log.strip()
        super().__init__(err, message)
        self.op, self.detail, self.log = op, detail, log

    def __str__(self) -> str:
        return self.strerror or ""


# --- the syscall ------------------------------------------------------------------------------------------------
_libc = None


def _syscall_number() -> int:
    nr = _SYSCALL.get(platform.machine().lower())
    if nr is None:
        raise BpfError(_errno.ENOSYS, "syscall", f"no bpf(2) syscall number known for {platform.machine()!r}")
    return nr


def _bpf(cmd: int, attr: ctypes.Array, op: str, detail: str = "") -> int:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.syscall.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_ulong)
        _libc = libc
    ret = _libc.syscall(_syscall_number(), cmd, ctypes.addressof(attr), ctypes.sizeof(attr))
    if ret < 0:
        raise BpfError(ctypes.get_errno(), op, detail)
    return ret


def _attr(size: int, *fields: tuple[int, str, int]) -> ctypes.Array:
    """A zeroed `union bpf_attr` prefix of `size` bytes with (offset, struct format, value) fields set."""
    buf = ctypes.create_string_buffer(size)
    for offset, fmt, value in fields:
        struct.pack_into("=" + fmt, buf, offset, value)
    return buf


# --- the assembler ----------------------------------------------------------------------------------------------
# opcodes: class | op | source
_LDX_MEM_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_MOV64_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
_MOV64_X = 0xBF  # BPF_ALU64 | BPF_MOV | BPF_X: dst = src
_AND64_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K: dst &= imm
_RSH64_K = 0x77  # BPF_ALU64 | BPF_RSH | BPF_K: dst >>= imm
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K: if dst != imm: pc += off
_EXIT = 0x95  # BPF_JMP | BPF_EXIT: return r0

# registers: r1 the context; r2 type, r3 access, r4 major, r5 minor; r0 scratch, then the verdict
R0, R1, R2, R3, R4, R5 = range(6)


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """struct bpf_insn { u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm; } in the machine's byte order (the
    bit-fields' order follows it: dst is the low nibble on little-endian machines)."""
    regs = (src << 4 | dst) if sys.byteorder == "little" else (dst << 4 | src)
    return struct.pack("=BBhi", code, regs, off, imm)


def _normalised(rules: Iterable) -> list[tuple[int | None, int | None, int | None, int]]:
    """(type or None for any, major or None, minor or None, access bits), in order, duplicates dropped."""
    out: dict[tuple, None] = {}
    for rule in rules:
        kind, major, minor, access = rule
        if kind not in _TYPES:
            raise ValueError(f"device rule {rule!r}: kind must be 'c', 'b' or 'a'")
        if not access or any(ch not in _ACCESS_BITS for ch in access):
            raise ValueError(f"device rule {rule!r}: access must be made of 'r', 'w', 'm'")
        for n in (major, minor):
            if n is not None and not (isinstance(n, int) and 0 <= n < 2**31):
                raise ValueError(f"device rule {rule!r}: device numbers are non-negative integers or None")
        bits = 0
        for ch in access:
            bits |= _ACCESS_BITS[ch]
        out[(_TYPES[kind], major, minor, bits)] = None
    return list(out)


def assemble(rules: Iterable) -> bytes:
    """The program's instructions for an allow-list of `(kind, major, minor, access)` rules (`DeviceRule`s)."""
    prog = [
        _insn(_LDX_MEM_W, R2, R1, 0),  # r2 = ctx->access_type
        _insn(_MOV64_X, R3, R2),  # r3 = r2
        _insn(_AND64_K, R2, imm=0xFFFF),  # r2 = type
        _insn(_RSH64_K, R3, imm=16),  # r3 = access
        _insn(_LDX_MEM_W, R4, R1, 4),  # r4 = ctx->major
        _insn(_LDX_MEM_W, R5, R1, 8),  # r5 = ctx->minor
    ]
    for dev_type, major, minor, bits in _normalised(rules):
        # Each test is a "jump to the next rule unless it holds"; the offsets are filled once the block is known.
        block: list[bytes | tuple[int, int]] = []  # an instruction, or (dst, imm) of a JNE to the block's end
        if dev_type is not None:
            block.append((R2, dev_type))
        if bits != _ALL_ACCESS:  # a requested bit the rule lacks: r0 = access & ~bits must be 0
            block.append(_insn(_MOV64_X, R0, R3))
            block.append(_insn(_AND64_K, R0, imm=_ALL_ACCESS & ~bits))
            block.append((R0, 0))
        if major is not None:
            block.append((R4, major))
        if minor is not None:
            block.append((R5, minor))
        block.append(_insn(_MOV64_K, R0, imm=1))
        block.append(_insn(_EXIT))
        for i, item in enumerate(block):
            if isinstance(item, tuple):
                dst, imm = item
                prog.append(_insn(_JNE_K, dst, off=len(block) - i - 1, imm=imm))
            else:
                prog.append(item)
    prog.append(_insn(_MOV64_K, R0, imm=0))
    prog.append(_insn(_EXIT))
    return b"".join(prog)


# --- load, attach, query, detach --------------------------------------------------------------------------------
def _load_attr(insns: ctypes.Array, count: int, license_buf: ctypes.Array, log: ctypes.Array | None) -> ctypes.Array:
    # prog_type @0, insn_cnt @4, insns @8, license @16, log_level @24, log_size @28, log_buf @32,
    # kern_version @40, prog_flags @44, prog_name[16] @48 (expected_attach_type @68 stays 0: a device program's
    # is not checked, and kernels that predate the field refuse a non-zero byte past their struct)
    attr = _attr(72, (0, "I", BPF_PROG_TYPE_CGROUP_DEVICE), (4, "I", count), (8, "Q", ctypes.addressof(insns)),
                 (16, "Q", ctypes.addressof(license_buf)))
    if log is not None:
        struct.pack_into("=IIQ", attr, 24, 1, ctypes.sizeof(log), ctypes.addressof(log))
    attr[48:48 + len(PROG_NAME)] = PROG_NAME
    return attr


def load(rules: Iterable) -> int:
    """Load the program for `rules`; returns its fd (close-on-exec). BpfError (with the verifier's log)."""
    code = assemble(rules)
    insns = ctypes.create_string_buffer(code, len(code))
    license_buf = ctypes.create_string_buffer(LICENSE)
    count = len(code) // 8
    try:
        return _load_with_memlock(_load_attr(insns, count, license_buf, None))
    except BpfError as first:
        if first.errno not in (_errno.EINVAL, _errno.EACCES, _errno.EPERM, _errno.E2BIG):
            raise
        log = ctypes.create_string_buffer(_LOG_SIZE)
        try:  # again, with the verifier's log (not the first time: a log too small for it fails the load)
            return _load_with_memlock(_load_attr(insns, count, license_buf, log))
        except BpfError as second:
            text = log.value.decode(errors="replace")
            hint = ""
            if second.errno == _errno.EPERM:
                hint = "loading needs CAP_BPF or CAP_SYS_ADMIN (and a kernel that allows bpf(2) here)"
            raise BpfError(second.errno, "BPF_PROG_LOAD", hint, text) from None


def _load_with_memlock(attr: ctypes.Array) -> int:
    """Kernels before 5.11 charge programs to RLIMIT_MEMLOCK and say EPERM when it is low: raise it for the load
    only and put it back (it must not leak into the shims and the work this process spawns)."""
    try:
        return _bpf(BPF_PROG_LOAD, attr, "BPF_PROG_LOAD")
    except BpfError as e:
        if e.errno != _errno.EPERM:
            raise
        old = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        if old[0] == resource.RLIM_INFINITY:
            raise
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):
            raise e from None
        try:
            return _bpf(BPF_PROG_LOAD, attr, "BPF_PROG_LOAD")
        finally:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_MEMLOCK, old)


def _open_cgroup(cgroup_dir: str) -> int:
    try:
        return os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise BpfError(e.errno or _errno.ENOENT, "open", f"cgroup directory {cgroup_dir}") from e


def prog_info(prog_fd: int) -> tuple[int, bytes]:
    """(id, name) of a loaded program (struct bpf_prog_info: id @4, name[16] @64)."""
    info = ctypes.create_string_buffer(80)
    attr = _attr(16, (0, "I", prog_fd), (4, "I", ctypes.sizeof(info)), (8, "Q", ctypes.addressof(info)))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "BPF_OBJ_GET_INFO_BY_FD")
    prog_id = struct.unpack_from("=I", info, 4)[0]
    return prog_id, bytes(info[64:80]).split(b"\0", 1)[0]


def prog_fd_by_id(prog_id: int) -> int:
    """An fd of a loaded program by its id (BpfError ENOENT once the program is gone)."""
    attr = _attr(12, (0, "I", prog_id))
    return _bpf(BPF_PROG_GET_FD_BY_ID, attr, "BPF_PROG_GET_FD_BY_ID", f"program id {prog_id}")


def attached(cgroup_dir: str) -> list[int]:
    """Ids of the device programs attached to this cgroup itself (not its ancestors')."""
    fd = _open_cgroup(cgroup_dir)
    try:
        room = 16
        while True:
            ids = (ctypes.c_uint32 * room)()
            # target_fd @0, attach_type @4, query_flags @8, attach_flags @12, prog_ids @16, prog_cnt @24
            attr = _attr(32, (0, "I", fd), (4, "I", BPF_CGROUP_DEVICE), (16, "Q", ctypes.addressof(ids)),
                         (24, "I", room))
            try:
                _bpf(BPF_PROG_QUERY, attr, "BPF_PROG_QUERY", cgroup_dir)
            except BpfError as e:
                if e.errno == _errno.ENOSPC and room < 65536:
                    room *= 4
                    continue
                raise
            return list(ids[:struct.unpack_from("=I", attr, 24)[0]])
    finally:
        os.close(fd)


def _detach(cgroup_fd: int, prog_fd: int, cgroup_dir: str) -> None:
    attr = _attr(20, (0, "I", cgroup_fd), (4, "I", prog_fd), (8, "I", BPF_CGROUP_DEVICE))
    _bpf(BPF_PROG_DETACH, attr, "BPF_PROG_DETACH", cgroup_dir)


def detach(cgroup_dir: str, keep: int | None = None) -> int:
    """Detach our programs (by name) from this cgroup except the one with id `keep`; how many were detached.
    Programs of others (a container runtime's) are left alone."""
    fd = _open_cgroup(cgroup_dir)
    done = 0
    try:
        for prog_id in attached(cgroup_dir):
            if prog_id == keep:
                continue
            try:
                prog_fd = prog_fd_by_id(prog_id)
            except BpfError as e:
                if e.errno == _errno.ENOENT:  # went meanwhile
                    continue
                raise
            try:
                if prog_info(prog_fd)[1] != PROG_NAME:
                    continue
                _detach(fd, prog_fd, cgroup_dir)
                done += 1
            finally:
                os.close(prog_fd)
    finally:
        os.close(fd)
    return done


def attach(cgroup_dir: str, rules: Iterable) -> int:
    """Load the allow-list program for `rules` and attach it to the cgroup v2 directory (BPF_F_ALLOW_MULTI);
    a program of ours already there is detached after the new one is in place. Returns the program's id; no fd
    stays open (the attachment keeps the program). BpfError."""
    prog_fd = load(rules)
    try:
        prog_id = prog_info(prog_fd)[0]
        cgroup_fd = _open_cgroup(cgroup_dir)
        try:
            attr = _attr(20, (0, "I", cgroup_fd), (4, "I", prog_fd), (8, "I", BPF_CGROUP_DEVICE),
                         (12, "I", BPF_F_ALLOW_MULTI))
            _bpf(BPF_PROG_ATTACH, attr, "BPF_PROG_ATTACH", cgroup_dir)
        finally:
            os.close(cgroup_fd)
    finally:
        os.close(prog_fd)
    detach(cgroup_dir, keep=prog_id)
    return prog_id


def available() -> tuple[bool, str]:
    """Whether a device program can be loaded here (a deny-all one, loaded and closed at once), and why not."""
    try:
        os.close(load([]))
    except BpfError as e:
        return False, str(e)
    return True, ""
