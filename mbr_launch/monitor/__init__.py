"""The rank monitor: one process per node that keeps each rank's deadlines and serves the NVRx clients."""
