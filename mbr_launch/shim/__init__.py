"""What runs inside a worker, before the user's script: boot, the standby's serve side, autobeat. Imports only ``mbr_launch.contract`` and ``mbr_launch.fdwait`` (standard library only, both)."""
