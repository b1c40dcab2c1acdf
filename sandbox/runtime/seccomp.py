"""The seccomp profile every sandboxed process runs under: deny by default.

Only the system calls that CPython, a POSIX shell and coreutils need are allowed; every
other call fails with EPERM. The allowlist starts from the published default profile of
container engines (Docker/moby) and drops what tool code never needs: kernel AIO, SysV
message queues and POSIX mqueues, ``modify_ldt``, ``remap_file_pages``, handle-based opens,
``memfd_secret``, ``process_mrelease``, clock adjustment, and everything the engines only
allow to privileged containers. ``DENIED`` names the calls an escape would reach for; none
is on the allowlist (a test checks it), so they fall to the default EPERM.

Three calls are allowed only with certain arguments: ``clone`` without namespace flags,
``socket`` for Unix, IP and netlink sockets (never ``AF_VSOCK``, which no network
namespace confines), ``personality`` for the values libc and ``setarch`` use. ``clone3``
answers ENOSYS (its flags sit in memory a filter cannot read), so libc falls back to
``clone``, whose flags the filter does check (under gVisor, which does not implement
``clone3``, gVisor's own ENOSYS does the same).

The same profile is rendered twice: as BPF for ``bwrap --seccomp FD`` (``filter_file``) and
as the OCI spec's ``linux.seccomp`` for gVisor, which enforces it in its own kernel
(``oci``). Calls the host's libseccomp does not know are left out of the BPF program (they
fall to the default EPERM). Only the native architecture is allowed: 32-bit entry points
(``int 0x80``, x32) kill the process.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from dataclasses import dataclass
from typing import IO, Any

FILES = (
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "preadv2", "pwritev",
    "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "dup",
    "dup2", "dup3", "fcntl", "flock", "ioctl", "pipe", "pipe2", "stat", "fstat", "lstat",
    "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
    "readlink", "readlinkat", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir",
    "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link",
    "linkat", "symlink", "symlinkat", "mknod", "mknodat", "chmod", "fchmod", "fchmodat",
    "fchmodat2", "chown", "fchown", "fchownat", "lchown", "umask", "truncate", "ftruncate",
    "fallocate", "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs",
    "sync_file_range", "utime", "utimes", "utimensat", "futimesat", "getxattr", "lgetxattr",
    "fgetxattr", "setxattr", "lsetxattr", "fsetxattr", "listxattr", "llistxattr",
    "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "copy_file_range",
    "sendfile", "splice", "tee", "vmsplice", "inotify_init", "inotify_init1",
    "inotify_add_watch", "inotify_rm_watch", "memfd_create", "cachestat",
)  # fmt: skip
PROCESSES = (
    "execve", "execveat", "fork", "vfork", "exit", "exit_group", "wait4", "waitid", "kill",
    "tkill", "tgkill", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp",
    "getsid", "setsid", "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid",
    "getgroups", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
    "setfsuid", "setfsgid", "setgroups", "capget", "capset", "prctl", "arch_prctl",
    "set_tid_address", "set_robust_list", "get_robust_list", "rseq", "getrlimit",
    "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority", "ioprio_get",
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
    "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_getattr",
    "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "getcpu", "pidfd_open", "pidfd_send_signal", "seccomp",
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
)  # fmt: skip
MEMORY = (
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "mlock",
    "mlock2", "munlock", "mlockall", "munlockall", "membarrier", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "map_shadow_stack", "futex", "futex_waitv", "futex_wait", "futex_wake",
    "futex_requeue", "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop",
    "semctl",
)  # fmt: skip
SIGNALS_AND_TIME = (
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "signalfd",
    "signalfd4", "restart_syscall", "pause", "alarm", "nanosleep", "clock_nanosleep",
    "clock_gettime", "clock_getres", "gettimeofday", "time", "times", "getitimer",
    "setitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun",
    "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_gettime", "uname",
    "sysinfo", "getrandom",
)  # fmt: skip
EVENTS_AND_SOCKETS = (
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "socketpair", "bind",
    "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "sendto",
    "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "getsockopt", "setsockopt",
    "shutdown",
)  # fmt: skip
ALLOWED = FILES + PROCESSES + MEMORY + SIGNALS_AND_TIME + EVENTS_AND_SOCKETS

DENIED = (
    "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "unshare", "setns", "ptrace",
    "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp", "mount", "umount2",
    "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick",
    "mount_setattr", "chroot", "name_to_handle_at", "open_by_handle_at", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "syslog", "acct", "quotactl", "iopl", "ioperm", "modify_ldt", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "io_setup", "io_submit",
    "mq_open", "msgget", "fanotify_init", "lookup_dcookie", "nfsservctl", "uselib",
)  # fmt: skip

# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
# CLONE_NEWNET (CLONE_NEWTIME shares its bit with clone's exit signal: clone3 and unshare only)
CLONE_NAMESPACES = 0x7E020000
SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # PER_LINUX(32), ADDR_NO_RANDOMIZE, query
ENOSYS = ("clone3",)


@dataclass(frozen=True, slots=True)
class ArgRule:
    """Allow ``name`` when argument ``index`` compares as ``op`` (``eq``: equals ``value``;
    ``masked_eq``: ``arg & mask == value``)."""

    name: str
    index: int
    op: str
    value: int
    mask: int = 0


CONDITIONAL = (
    ArgRule("clone", 0, "masked_eq", 0, CLONE_NAMESPACES),
    *(ArgRule("socket", 0, "eq", family) for family in SOCKET_FAMILIES),
    *(ArgRule("personality", 0, "eq", value) for value in PERSONALITIES),
)


@functools.cache
def _bpf() -> bytes:
    import pyseccomp as seccomp

    arch = seccomp.system_arch()
    f = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))

    def known(name: str) -> bool:
        return int(seccomp.resolve_syscall(arch, name)) >= 0

    for name in ALLOWED:
        if known(name):
            f.add_rule(seccomp.ALLOW, name)
    for rule in CONDITIONAL:
        if rule.op == "eq":
            arg = seccomp.Arg(rule.index, seccomp.EQ, rule.value)
        else:
            arg = seccomp.Arg(rule.index, seccomp.MASKED_EQ, rule.mask, rule.value)
        f.add_rule(seccomp.ALLOW, rule.name, arg)
    for name in ENOSYS:
        if known(name):
            f.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def filter_file() -> IO[bytes]:
    """A temporary file holding the compiled BPF program (for ``bwrap --seccomp FD``).

    The program is compiled once per process; each run gets its own file to pass on."""
    out = tempfile.TemporaryFile()  # noqa: SIM115 - the caller passes its fd on, then closes it
    out.write(_bpf())
    out.seek(0)
    return out


def oci() -> dict[str, Any]:
    """The profile as an OCI runtime spec's ``linux.seccomp`` (for gVisor's ``--oci-seccomp``)."""
    conditional = [
        {"names": [r.name], "action": "SCMP_ACT_ALLOW", "args": [_oci_arg(r)]} for r in CONDITIONAL
    ]
    # gVisor (the 2022 build here) ignores a rule's errnoRet, so an ENOSYS rule would answer
    # EPERM and libc would not fall back from clone3 to clone: threads could not start. It
    # does not implement clone3 either and answers ENOSYS itself, so the call passes to it.
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": [{"names": [*ALLOWED, *ENOSYS], "action": "SCMP_ACT_ALLOW"}, *conditional],
    }


def _oci_arg(rule: ArgRule) -> dict[str, Any]:
    if rule.op == "masked_eq":  # OCI: (arg & value) == valueTwo
        return {"index": rule.index, "value": rule.mask, "valueTwo": rule.value,
                "op": "SCMP_CMP_MASKED_EQ"}  # fmt: skip
    return {"index": rule.index, "value": rule.value, "op": "SCMP_CMP_EQ"}
