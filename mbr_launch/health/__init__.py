"""ft_launcher 0.6/0.7's node checks around a rendezvous, as mbr-launch gives them meaning.

Before each join (the first and every re-join after a restart) a node checks itself; one that fails does
not join, says which check failed and why, and exits ``exitcodes.UNHEALTHY``. Between a round's stop and
the next join it looks for processes the stop left alive and waits for its GPUs' memory to come back.
Decisions (``checks``, ``gpumem``, ``gpuowners``, ``leftovers``) are pure; reads are apart (``readers``, ``nvml``).
Workers' NUMA binding (``NVRX_GPUS_PER_NUMA``) lives with the workers: ``workers.numa``.
"""
