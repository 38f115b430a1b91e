"""Run a launcher (``python storecount.py MODULE ARGS...``) with every rendezvous-store call counted.

Patches the Python methods of torch's ``TCPStore`` and ``PrefixStore`` (a ``PrefixStore`` call reaches its
inner store in C++, so each operation counts once) and appends, every ``PERIOD`` seconds while the counts move,
one JSON line to ``$MBR_STORECOUNT_DIR/<pid>.jsonl``: ``{"t": time.time(), "ops": {op: n}, "sent": B,
"recv": B}`` (cumulative). Bytes are the payload (keys, values) plus 9 bytes of framing per argument, as the
TCPStore wire protocol sends them: an estimate of what the store's host reads and writes, not a capture.
Periodic, not at exit: the launchers end with ``os._exit``.

Used by bench_scale.py ``--count-store``; the workers are not wrapped (the scale worker has no store).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from typing import Any

PERIOD = 0.25
OPS = ("set", "get", "add", "compare_set", "check", "wait", "multi_get", "multi_set", "delete_key", "num_keys",
       "append")
FRAME = 9

_lock = threading.Lock()
_ops: dict[str, int] = {}
_bytes = {"sent": 0, "recv": 0}


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value) + FRAME
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value) + FRAME
    return FRAME + 8  # ints, timeouts


def _wrap(cls: type, name: str) -> None:
    original = getattr(cls, name, None)
    if original is None:
        return

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = None
        try:  # a call that raises (a wait that timed out) went to the store too
            result = original(self, *args, **kwargs)
            return result
        finally:
            with _lock:
                _ops[name] = _ops.get(name, 0) + 1
                _bytes["sent"] += FRAME + sum(_size(a) for a in args) + sum(_size(v) for v in kwargs.values())
                _bytes["recv"] += _size(result) if result is not None else FRAME

    setattr(cls, name, counted)


def _writer(path: str) -> None:
    last = None
    while True:
        time.sleep(PERIOD)
        with _lock:
            snap = (dict(_ops), dict(_bytes))
        if snap != last:
            last = snap
            with open(path, "a") as f:
                f.write(json.dumps({"t": time.time(), "ops": snap[0], **snap[1]}) + "\n")


def _trace(path: str) -> None:
    """With MBR_RDZV_TRACE set: one line per decision of torch's join/exit operations (what the node saw and
    what it chose) and per state write (won or lost), to find where a join spends its time."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    def log(**fields: Any) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"t": time.time(), **fields}) + "\n")

    for cls in (dr._RendezvousJoinOp, dr._RendezvousExitOp):
        original = cls.__call__

        def call(self: Any, ctx: Any, deadline: float, _original: Any = original, _name: str = cls.__name__) -> Any:
            action = _original(self, ctx, deadline)
            st = ctx.state
            log(op=_name, action=action.name, round=st.round, complete=st.complete, participants=len(st.participants),
                wait=len(st.wait_list), spare=len(st.redundancy_list), me=ctx.node in st.participants)
            return action

        cls.__call__ = call
    sync = dr._BackendRendezvousStateHolder.sync

    def traced_sync(self: Any) -> Any:
        dirty = self._dirty
        result = sync(self)
        if dirty:
            log(op="write", won=bool(result), dead=len(self._dead_nodes))
        elif self._dead_nodes:
            log(op="read", dead=len(self._dead_nodes))
        return result

    dr._BackendRendezvousStateHolder.sync = traced_sync


def main() -> None:
    from torch.distributed import PrefixStore, TCPStore

    for cls in (TCPStore, PrefixStore):
        for name in OPS:
            _wrap(cls, name)
    out = os.environ["MBR_STORECOUNT_DIR"]
    os.makedirs(out, exist_ok=True)
    if os.environ.get("MBR_RDZV_TRACE"):
        _trace(os.path.join(out, f"{os.getpid()}.trace"))
    threading.Thread(target=_writer, args=(os.path.join(out, f"{os.getpid()}.jsonl"),), daemon=True).start()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()


# ---- reading the counts back (the bench's side) -----------------------------------------------------------

def load(directory: str) -> list[list[dict]]:
    """Every counted process's snapshots (one list per .jsonl file, in time order)."""
    series = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                series.append([json.loads(line) for line in f if line.strip()])
    return series


def at(snaps: list[dict], t: float) -> dict:
    """The cumulative counts of one process at time t (zero before its first snapshot)."""
    best: dict = {"ops": {}, "sent": 0, "recv": 0}
    for snap in snaps:
        if snap["t"] > t + PERIOD:  # a snapshot is written up to PERIOD after the calls it counts
            break
        best = snap
    return best


def window(series: list[list[dict]], start: float, end: float) -> dict:
    """Store traffic of all processes between two times: ops by name, total ops, bytes, and per process."""
    per: list[tuple[int, int]] = []
    ops: dict[str, int] = {}
    for snaps in series:
        a, b = at(snaps, start), at(snaps, end)
        n = 0
        for name, count in b["ops"].items():
            d = count - a["ops"].get(name, 0)
            ops[name] = ops.get(name, 0) + d
            n += d
        per.append((n, (b["sent"] - a["sent"]) + (b["recv"] - a["recv"])))
    return {"ops": ops, "total_ops": sum(n for n, _ in per), "bytes": sum(b for _, b in per),
            "max_agent_ops": max((n for n, _ in per), default=0), "processes": len(per)}
