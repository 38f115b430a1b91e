"""A worker that joins its process group at the address and port given to the launcher, as older scripts do.

``fixed_port_init.py OUT_DIR tcp|env HOST PORT fail|ok SECONDS``: ``tcp`` initialises with
``init_method=tcp://HOST:PORT`` (the rank and world size from the environment), ``env`` with ``env://``
(MASTER_ADDR and MASTER_PORT), with a process-group timeout of SECONDS. One all_reduce of the ranks; with
``fail``, in restart 0 (``TORCHELASTIC_RESTART_COUNT``) rank 1 exits 1 after it, so that the next attempt joins
again at the same port. Each rank writes ``OUT_DIR/rank<R>.attempt<N>.json``: what it saw and summed, and
whether a key it set in the store in an earlier attempt was still there.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    out, how, host, port, fail, seconds = Path(sys.argv[1]), *sys.argv[2:5], sys.argv[5] == "fail", float(sys.argv[6])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    method = f"tcp://{host}:{port}" if how == "tcp" else "env://"
    dist.init_process_group("gloo", init_method=method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=seconds))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    seen = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}
    # A key of this rank's first attempt, still there in a later one: the store kept the attempt's keys.
    store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=seconds))
    stale = store.check([f"fixed_port_init/rank{rank}"])
    store.set(f"fixed_port_init/rank{rank}", str(attempt))
    (out / f"rank{rank}.attempt{attempt}.json").write_text(json.dumps({"sum": total.item(), "env": seen,
                                                                       "stale": stale}))
    dist.destroy_process_group()
    if fail and attempt == 0 and rank == 1:
        return 1  # the failure the launcher restarts from
    return 0


if __name__ == "__main__":
    sys.exit(main())
