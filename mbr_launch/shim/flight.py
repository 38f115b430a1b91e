"""Flight Recorder dumps on the agent's request, from inside the worker; armed by ``mbr_launch.shim.boot``.

The agent writes a byte to the FIFO ``MBR_FR_TRIGGER`` names; a thread here, blocked reading it, writes the
rank's Flight Recorder dumps (its collective progress per process group) next to ``MBR_FR_FILE``. A Python
thread because gloo, and builds without NCCL, have no dump pipe of their own; it needs the GIL, so a rank stuck
in C code holding it gives no dump, which is evidence too. Cheap: started with ``_thread``, and torch is only
looked up in ``sys.modules``, never imported.
"""

from __future__ import annotations

import _thread
import os
import stat  # loaded by os already: costs nothing
import sys

from mbr_launch.contract import FR_FILE_ENV, FR_NCCL_SUFFIX as NCCL_SUFFIX, FR_TRIGGER_ENV

_C10D = "torch._C._distributed_c10d"


def arm() -> bool:
    """Start the dump thread if the agent asked for one (``MBR_FR_TRIGGER``); True when started."""
    trigger, out = os.environ.get(FR_TRIGGER_ENV), os.environ.get(FR_FILE_ENV)
    if not trigger or not out:
        return False
    try:
        # O_RDWR: as a writer too, the FIFO never reads EOF and opening never blocks. O_NOFOLLOW and the check
        # below: only the agent's own FIFO, never a file put in its place (O_CLOEXEC is os.open's default).
        fd = os.open(trigger, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            return False
        os.set_blocking(fd, True)  # the thread waits in read()
        _thread.start_new_thread(_serve, (fd, out))
    except Exception:
        os.close(fd)
        return False
    return True


def _serve(fd: int, out: str) -> None:
    while True:
        try:
            if not os.read(fd, 64):  # several requests queued meanwhile make one dump
                return
        except InterruptedError:
            continue
        except OSError:
            return
        try:
            dump(out)
        except BaseException:  # never disturb the script (a failed dump is absent evidence, not an error)
            pass


def dump(out: str) -> bool:
    """Write this process's Flight Recorder dumps atomically, gloo's (``_dump_fr_trace``) in ``out`` and NCCL's
    in ``out.nccl``; False when there is nothing to dump."""
    c10d = sys.modules.get(_C10D)
    if "torch.distributed" not in sys.modules or c10d is None:
        return False
    wrote = False
    # NCCL's first: the agent waits for ``out`` and then reads both.
    for name, path in (("_dump_nccl_trace", out + NCCL_SUFFIX), ("_dump_fr_trace", out)):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            # Collectives yes, Python stacks no (they need the GIL and make the dump slow), all entries.
            _write(path, fn(True, False, False))
            wrote = True
        except Exception:
            pass
    return wrote


def _write(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)  # left by a dump of ours that failed half-way (or put there: O_EXCL makes a new one)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # the agent sees either no file or a whole one
