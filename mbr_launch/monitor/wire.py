"""The names on the agent <-> monitor control channel, spelled once for both ends.

The channel is JSON lines: commands on the monitor's stdin, events on its stdout. The monitor produces the
events (``server.py`` and its helpers); the agent decodes them (``link.py``). Both import the names from
here. ``Op`` and ``MonitorEvent`` are ``str`` enums, so a member is its wire string: it compares equal to the
string the other end sent, and ``json.dumps`` writes it unchanged (``enum.StrEnum`` would need Python 3.11).

Agent -> monitor (one object per line):
  {"op":"configure","dir":D,"cfg":{...FaultToleranceConfig fields...},
   "steps":{"initial":S|null,"subsequent":S|null,"report_interval":S,"status_interval":S|null}}
                                                                          -> {"ev":"ready","launcher_socket":..}
  {"op":"arm","local_rank":L,"rank":R,"pid":P|null,"pgid":G|null,"socket":D/rmonL.sock,
   "step_socket":D/stepsL.sock|absent}                                    -> {"ev":"armed",..}
  {"op":"pid","local_rank":L,"pid":P,"pgid":G}                            (no reply)
  {"op":"disarm","local_rank":L}                                          -> {"ev":"disarmed","local_rank":L}
  {"op":"snapshot"}                                                       -> {"ev":"snapshot","ranks":[..]}
  {"op":"exit"}                                                           (no reply; exit 0)
  EOF: SIGKILL the process group of every armed worker, exit.

Monitor -> agent, unsolicited: connected, first_heartbeat, first_progress, expired, timeouts_updated,
workload_request, disconnected, error. A bad control line yields {"ev":"error","message":..,"op":..} and
nothing else.

A worker's first sign of progress that is neither a step nor an NVRx heartbeat (at most one per arm, and none
once a first_step or first_heartbeat came; ``steps.py`` says which signs count):
  {"ev":"first_progress","local_rank":L,"rank":R,"kind":"checkpoint"|"collectives"|"iteration",
   "t":seconds since arm,"monotonic":M}

Automatic step beats (``steps.py``; a datagram socket per rank when ``arm`` names one):
  {"ev":"first_step","local_rank":L,"rank":R,"t":seconds since arm,"monotonic":M}
  {"ev":"expired",...,"kind":"step","step":last step index}            (step deadline passed)
  {"ev":"steps","ranks":[{"local_rank":L,"rank":R,"nvrx_client":bool,"steps":N,"index":I,
     "periods":[s..],"cpu":[s..],"first":M,"last":M,"checkpoint":M|null}]}   at most every report_interval
  {"ev":"status","ranks":[..as in snapshot..]}                          every status_interval, when set
  (M: time.monotonic() of this host, the agent's clock too.)

The fields of ``expired``, ``snapshot`` and ``status`` are built in ``state.py``.
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
