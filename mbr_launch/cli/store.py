"""``mbr-launch store [--port PORT] [--host NAME]``: the c10d rendezvous store, served on a host that trains nothing."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mbr_launch.api import serve_store
from mbr_launch.cli.process import CommandError


def store_command(
    port: Annotated[int, typer.Option(
        "--port", metavar="PORT", min=1, max=65535,
        help="The port to serve on (agents: --rdzv-endpoint HOST:PORT).")] = 29400,
    host: Annotated[Optional[str], typer.Option(
        "--host", metavar="NAME", show_default=False,
        help="The name agents reach this host by, for the line printed at start. Default: this host's name.")] = None,
) -> None:
    """Serve the c10d rendezvous store from this host until SIGTERM or Ctrl-C. Agents started with
    --rdzv-backend c10d --rdzv-endpoint HOST:PORT use it, so losing a training node never loses the store
    (with the store on a training node, its loss ends the job). Run it on the login or batch host of the job;
    one store serves several jobs, each with its own --rdzv-id."""
    from mbr_launch.cluster.storeserver import StoreServeError

    try:
        served = serve_store(port, host=host or "")
    except StoreServeError as err:
        raise CommandError(str(err)) from None
    print(f"mbr-launch store: stopped by {served.signal}", flush=True)
