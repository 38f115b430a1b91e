"""ft_launcher 0.6/0.7's node checks around a rendezvous (docs/node-checks.md).

Decisions (``checks``, ``gpumem``, ``gpuowners``, ``leftovers``) are pure; reads are apart (``suite``, ``nvml``).
"""
