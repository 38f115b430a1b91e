"""How a setting is declared: the ``Setting`` record, the shorthands for torchrun's, mbr-launch's own and
ft_launcher's flags, the help panels, and how a default reads. ``settings`` holds the table itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mbr_launch.config.nvrx import release
from mbr_launch.config.parse import Parser

TORCHRUN = "torchrun"
FAULT = "Fault tolerance"
HEALTH = "Node health"
POLICY = "Restart policy"
SLURM = "Slurm"
LOGGING = "Logging"
CHECKS = "Preflight checks"
COMPAT = "ft_launcher compatibility"  # accepted with ft_launcher's spellings; each help says what happens instead
PANELS = (TORCHRUN, FAULT, HEALTH, POLICY, SLURM, LOGGING, CHECKS, COMPAT)


@dataclass(frozen=True)
class Setting:
    name: str  # attribute name on the resolved config, and key in the config file's `mbr_launch:` section
    flags: tuple[str, ...]  # first is the canonical flag; the rest are aliases (torchrun, ft_launcher)
    kind: type  # str, int, float or bool (bool settings are flags that take no value, unless valued)
    default: Any
    help: str
    panel: str
    parse: Parser | None = None  # str/raw -> typed value; raises SettingError
    env: tuple[str, ...] = ()  # extra environment names besides MBR_<NAME>
    ft_key: str | None = None  # key in ft_launcher's YAML `fault_tolerance:` section
    torchrun_dest: str | None = None  # dest in torch.distributed.run.get_args_parser()
    # torchrun's own option strings (no ft_launcher alias) and the torch release that added them (``cli.abbrev``).
    torchrun_flags: tuple[str, ...] = ()
    torchrun_since: tuple[int, ...] = ()
    choices: tuple[str, ...] = ()
    metavar: str = ""
    hidden: bool = False  # accepted for compatibility, not shown in help
    # A bool that takes a value (``--ft-enable-nic-monitor=False``), as ft_launcher's do.
    valued: bool = False
    common: bool = False  # shown by plain --help (the torchrun basics and the few fault-tolerance flags most need)
    # Values to suggest (completions, --help) for a setting that also takes others, e.g. a number or a word.
    values: tuple[str, ...] = ()
    # (NVRx line, default) pairs, oldest first, each applying from that line of the workers' NVRx on.
    nvrx_defaults: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # A ``choice`` parser knows its choices: take them from it, so they are declared once.
        if not self.choices and getattr(self.parse, "choices", None):
            object.__setattr__(self, "choices", tuple(self.parse.choices))  # type: ignore[union-attr]

    def default_for(self, generation: str | None) -> Any:
        chosen = self.default
        for line, value in self.nvrx_defaults:
            if generation is not None and release(generation) >= release(line):
                chosen = value
        return chosen

    @property
    def envvars(self) -> tuple[str, ...]:
        return (f"MBR_{self.name.upper()}", *self.env)

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def takes_value(self) -> bool:
        return self.kind is not bool or self.valued

    @property
    def shown_flags(self) -> tuple[str, ...]:
        """The spellings offered in --help and completions: underscore aliases are accepted but not offered twice."""
        plain = tuple(f for f in self.flags if "_" not in f)
        return plain or self.flags[:1]

    @property
    def suggestions(self) -> tuple[str, ...]:
        if self.choices or self.values:
            return self.choices or self.values
        return ("true", "false") if self.kind is bool and self.valued else ()

    @property
    def bounds(self) -> str:
        return str(getattr(self.parse, "bounds", ""))

    @property
    def value_hint(self) -> str:
        if not self.takes_value:
            return ""
        if self.choices:
            return "{" + ",".join(self.choices) + "}"
        return self.metavar or "VALUE"


def torchrun_setting(name: str, kind: type, default: Any, help: str, *, short: str | None = None,
                     pet: bool = True, parse: Parser | None = None,
                     metavar: str = "", panel: str = TORCHRUN, aliases: tuple[str, ...] = (),
                     common: bool = False, values: tuple[str, ...] = (), env: tuple[str, ...] = (),
                     since: tuple[int, ...] = ()) -> Setting:
    """One of torchrun's options; ``since``: the torch release whose torchrun added it (none: 2.13 has it)."""
    dashed = "--" + name.replace("_", "-")
    own = ([short] if short else []) + [dashed] + ([f"--{name}"] if "_" in name else [])
    envvars = ((f"PET_{name.upper()}",) if pet else ()) + env
    return Setting(name=name, flags=(*own, *aliases), kind=kind, default=default, help=help, panel=panel,
                   parse=parse, env=envvars, torchrun_dest=name, metavar=metavar, common=common,
                   values=values, torchrun_flags=tuple(own), torchrun_since=since)


def own_setting(name: str, kind: type, default: Any, *, help: str, panel: str, aliases: tuple[str, ...] = (),
                **details: Any) -> Setting:
    return Setting(name=name, flags=("--" + name.replace("_", "-"), *aliases), kind=kind, default=default, help=help,
                   panel=panel, **details)


def ft_setting(name: str, ft_name: str, kind: type, default: Any, help: str, *, native: str | None = None,
               parse: Parser | None = None, panel: str = FAULT, metavar: str = "",
               deprecated_dashed: bool = False, valued: bool = False, common: bool = False,
               nvrx_defaults: tuple[tuple[str, Any], ...] = ()) -> Setting:
    """A setting that ft_launcher also has, with its spellings. ``deprecated_dashed``: 0.4.1's ``--ft-param-a-b``
    and ``--ft_param_a_b`` spellings too (deprecated there, still in NVRx's own scripts)."""
    flags = []
    if native:
        flags.append(native)
    dashed = ft_name.replace("_", "-")
    flags += [f"--ft-{dashed}", f"--ft-{ft_name}", f"--ft-param-{ft_name}"]
    if deprecated_dashed:
        flags += [f"--ft-param-{dashed}", f"--ft_param_{ft_name}"]
    unique = tuple(dict.fromkeys(flags))
    return Setting(name=name, flags=unique, kind=kind, default=default, help=help, panel=panel,
                   parse=parse, ft_key=ft_name, metavar=metavar, valued=valued, common=common,
                   nvrx_defaults=nvrx_defaults)


def nvrx_setting(name: str, kind: type, default: Any, help: str, *, option: str | None = None,
                 field: str | None = None, twin: str = "--ft_", panel: str = FAULT, parse: Parser | None = None,
                 metavar: str = "", valued: bool = False, env: tuple[str, ...] = (),
                 nvrx_defaults: tuple[tuple[str, Any], ...] = ()) -> Setting:
    """An option ft_launcher 0.6 or 0.7 added: ``--ft-<option>`` and its ``twin`` spelling (``--ft_<option>`` or
    ``--ft-<option>`` with underscores); ``field`` is its FaultToleranceConfig field, None for a launcher option."""
    under = option or name
    flags = (f"--ft-{under.replace('_', '-')}", f"{twin}{under}")
    return Setting(name=name, flags=flags, kind=kind, default=default, help=help, panel=panel, parse=parse, env=env,
                   ft_key=field, metavar=metavar, valued=valued, nvrx_defaults=nvrx_defaults)


def default_text(setting: Setting) -> str:
    default = setting.default
    if setting.kind is bool:
        return ("true" if default else "false") if setting.valued else ("on" if default else "off")
    if isinstance(default, dict):
        return ",".join(f"{k}:{v}" for k, v in default.items())
    if isinstance(default, tuple):
        return ",".join(str(v) for v in default)
    return "" if default is None else str(default)


def in_panel_order(settings: "tuple[Setting, ...] | list[Setting]") -> list[Setting]:
    return sorted(settings, key=lambda s: PANELS.index(s.panel))
