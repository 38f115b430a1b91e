"""The test harness shared by tests/ and benchmarks/: launching the real launcher, the fault matrix's cases and
runs, network namespaces, the Slurm test cluster, NVRx's examples. Not installed (pyproject's package discovery
takes ``mbr_launch*`` only); importable from the repository root, which pytest (rootdir) and the benchmarks
(``benchmarks/harness/paths.py``) put on ``sys.path``."""
