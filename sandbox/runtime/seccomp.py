"""The seccomp filter every sandboxed process runs under.

Allow by default, refuse (EPERM) the calls a tool never needs and an escape
would: tracing other processes, namespaces and mounts, kernel modules and
keyrings, BPF and perf, reading other processes' memory. Network isolation
comes from the empty network namespace, not from here.
"""

from __future__ import annotations

import errno
import tempfile
from typing import IO

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
    "chroot", "unshare", "setns", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "userfaultfd", "open_by_handle_at", "name_to_handle_at", "syslog",
    "acct", "quotactl", "fsopen", "fsmount", "move_mount", "open_tree", "iopl", "ioperm",
)  # fmt: skip


def filter_file() -> IO[bytes]:
    """A temporary file holding the compiled BPF program (for ``bwrap --seccomp FD``)."""
    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED:
        f.add_rule(seccomp.ERRNO(errno.EPERM), name)
    out = tempfile.TemporaryFile()  # noqa: SIM115 - the caller passes its fd on, then closes it
    f.export_bpf(out)
    out.seek(0)
    return out
