"""ft_launcher 0.6/0.7's node checks around a rendezvous, as mbr-launch gives them meaning.

Before each join (the first and every re-join after a restart) a node checks itself; one that fails does
not join, says which check failed and why, and exits ``exitcodes.UNHEALTHY``. Between a round's stop and
the next join it looks for processes the stop left alive and waits for its GPUs' memory to come back.

- ``result``: what a check found (``CheckResult``), the same type the doctor's checks return;
- ``checks``: pure decisions over what was read (storage paths, network file systems, NIC link states, the
  scheduler's segment decision, the node-health daemon's reply);
- ``probe``: the child process that touches storage paths (a hung NFS mount blocks it, not the launcher);
- ``readers``: the file system and process reads behind the checks;
- ``nodehealth``: the node-health daemon's gRPC call over its unix socket (nvhcd's protocol);
- ``gpumem``: the GPU memory reclaim wait: for the memory of the job's ended processes only (pure);
- ``gpuowners``: whose each process on the GPUs is (the job's, ended or running, or a stranger's);
- ``nvml``: NVML, read in this one module (the doctor's GPU checks use it too);
- ``leftovers``: processes of a stopped round still alive.

Workers' NUMA binding (``NVRX_GPUS_PER_NUMA``) lives with the workers: ``workers.numa``.
"""
