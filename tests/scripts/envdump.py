"""Write this worker's environment to $DUMP_DIR/<RANK>.json (used to compare launchers)."""
import json
import os
import sys

out = os.path.join(sys.argv[1], f"{os.environ['RANK']}.json")
with open(out, "w") as f:
    json.dump(dict(os.environ), f)
