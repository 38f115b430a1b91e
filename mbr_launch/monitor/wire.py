"""The names on the agent <-> monitor control channel, spelled once for both ends.

JSON lines: commands on the monitor's stdin, events on its stdout (produced by ``server.py`` and its helpers,
decoded by ``link.py``). ``Op`` and ``MonitorEvent`` are ``str`` enums: a member is its wire string.

Agent -> monitor, and the reply:
  {"op":"configure","dir":D,"cfg":{..FaultToleranceConfig..},
   "steps":{"initial":S|null,"subsequent":S|null,"report_interval":S,"status_interval":S|null}} -> ready
  {"op":"arm","local_rank":L,"rank":R,"pid":P|null,"pgid":G|null,"socket":D/rmonL.sock,
   "step_socket":D/stepsL.sock|absent}                                    -> armed
  {"op":"pid","local_rank":L,"pid":P,"pgid":G}                            (no reply)
  {"op":"disarm","local_rank":L}                                          -> disarmed
  {"op":"snapshot"}                                                       -> snapshot {"ranks":[..]}
  {"op":"exit"}                                                           (no reply; exit 0)
  EOF: SIGKILL the process group of every armed worker, exit.

Monitor -> agent, unsolicited: the other ``MonitorEvent`` members (``first_progress``: at most one per arm,
``steps.py``; ``steps``: at most every report_interval; ``status``: every status_interval; ``error``
{"message":..,"op":..} for a bad control line). "monotonic" fields are this host's ``time.monotonic()``, the
agent's clock too; the larger payloads are built in ``state.py``.
"""

from __future__ import annotations

import enum

SERVER_MODULE = "mbr_launch.monitor.server"  # ``python -m`` this to start a monitor


class _Wire(str, enum.Enum):
    def __str__(self) -> str:  # format like the plain string, as StrEnum does
        return str(self.value)


class Op(_Wire):
    """The ``op`` of a command from the agent."""

    CONFIGURE = "configure"
    ARM = "arm"
    PID = "pid"
    DISARM = "disarm"
    SNAPSHOT = "snapshot"
    EXIT = "exit"


class MonitorEvent(_Wire):
    """The ``ev`` of an event from the monitor."""

    # replies to a command
    READY = "ready"
    ARMED = "armed"
    DISARMED = "disarmed"
    SNAPSHOT = "snapshot"
    # unsolicited
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    FIRST_HEARTBEAT = "first_heartbeat"
    FIRST_STEP = "first_step"
    FIRST_PROGRESS = "first_progress"
    EXPIRED = "expired"
    TIMEOUTS_UPDATED = "timeouts_updated"
    WORKLOAD_REQUEST = "workload_request"
    STEPS = "steps"
    STATUS = "status"
    ERROR = "error"


# ``kind`` of an ``expired`` event: a ``deadlines.Kind`` value, or this one for a missed step beat.
STEP_KIND = "step"
