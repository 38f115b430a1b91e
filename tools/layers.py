"""The package's import rules, declared once: for each folder of ``mbr_launch`` (and each module at its top), the
folders and modules it may import; read by tests/test_layers.py (every import is allowed, no cycle) and by
scripts/layer-map (the rules and the layer map in docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mbr_launch"

# Modules at the top of the package that import only the standard library: importing one drags nothing in.
# PURE ones do no IO (text and names): even the pure decisions may use them.
PURE = ("contract", "visible", "outside")
LEAVES = (*PURE, "fdwait", "procstat", "forking", "gcpause", "nofile")

# What each folder may import besides itself: a folder (``decide``: mbr_launch/decide/ and all in it), a module
# at the top (``contract``), or one module of a folder (``shim.proctitle``) where the folder as a whole is not
# allowed. Lowest first: a folder lists only names above it, so the folders have no import cycle and the map
# reads bottom-up.
#
# A new module in a folder needs nothing here. A new standard-library-only module at the top goes into LEAVES
# (PURE too if it does no IO) with an empty list of its own: every folder that takes the leaves may use it. A new
# folder gets a line. A folder that needs a new arrow gets it on its line, with the reason when it is not obvious.
ALLOWED: dict[str, tuple[str, ...]] = {
    # the standard library only (the worker shim imports the first four: tests/test_shim_isolation.py)
    "contract": (), "visible": (), "fdwait": (), "procstat": (), "forking": (), "gcpause": (), "nofile": (),
    # values read from outside (store, sockets, dumps): escaped and cut as visible words them
    "outside": ("visible",),
    # the restricted unpickler (the monitor's frames, the Flight Recorder's dumps): the standard library only
    "unpickle": (),
    # inside every worker, before the user's script: nothing of the agent (test_shim_isolation checks the process)
    "shim": ("contract", "fdwait", "procstat", "forking"),
    # facts in, decision out: no IO, no clock
    "decide": PURE,
    # events, summary, exit codes, run folders: they word decisions (goodput_text, verdict_text, causes)
    "report": (*LEAVES, "decide"),
    # settings, validation, Slurm: the policy's names (decide), versions, exit codes and private files (report)
    "config": (*LEAVES, "decide", "report"),
    # rendezvous, stores, peers: a round is built from the config; peer silence is judged in decide
    "cluster": (*LEAVES, "decide", "report", "config"),
    # worker processes: a round and its store (cluster); the fork server runs the shim's fork side in the launcher
    "workers": (*LEAVES, "unpickle", "decide", "report", "config", "cluster", "shim"),
    # node health before a join: leftover processes are found by workers.strays
    "health": (*LEAVES, "report", "config", "workers"),
    # a process of its own (PROCESSES below); its agent side (link) also takes the launcher's leaves and
    # names its forked child as the shim names a standby
    "monitor": (*LEAVES, "unpickle", "shim.proctitle"),
    # the supervisor: everything below it but the worker shim
    "agent": (*LEAVES, "decide", "report", "config", "cluster", "workers", "health", "monitor"),
    # named checks: what the launch would use, probed; process ancestry from the monitor
    "doctor": (*LEAVES, "decide", "report", "config", "cluster", "workers", "health", "monitor.ancestry"),
    # the Python API the CLI stands on: builds the config, serves stores, starts the monitor and the agent
    "api": (*LEAVES, "report", "config", "cluster", "workers", "monitor.link", "agent", "doctor"),
    # the command line: options from the settings table, one error -> one exit code; launches through api
    "cli": (*LEAVES, "report", "config", "cluster", "doctor", "api"),
    "__main__": ("cli",),
}

# Entry modules of processes of their own, and all that they may load (their imports, followed through): a
# process started as ``python -S -m`` has only the standard library and this package.
PROCESSES: dict[str, tuple[str, ...]] = {
    # the rank monitor, one per node: never the agent, torch or rich (tests/test_layers_monitor.py: the process)
    "monitor.server": ("monitor", "contract", "procstat", "unpickle"),
}

# The map's order: the folders lowest first.
LAYERS = tuple(ALLOWED)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its ``__init__.py``)."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("mbr_launch", *path.relative_to(root).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def layer(module: str) -> str:
    """The folder of a dotted module name: its package under mbr_launch, or its own name at the top (the package
    itself, ``mbr_launch``, stands with the contract: it only names the project)."""
    return module.split(".")[1] if module != "mbr_launch" else "contract"


def covers(entry: str, module: str) -> bool:
    """Whether an allow-list entry (``decide``, ``shim.proctitle``) names ``module`` (a dotted name)."""
    name = module.removeprefix("mbr_launch.")
    return name == entry or name.startswith(entry + ".")


def allowed(src: str, dst: str, rules: dict[str, tuple[str, ...]] | None = None) -> bool:
    """Whether module ``src`` may import module ``dst``: the same folder, or an entry of the folder's list."""
    rules = ALLOWED if rules is None else rules
    return layer(src) == layer(dst) or any(covers(entry, dst) for entry in rules.get(layer(src), ()))
