"""The kit runtimes use: the environment loop, the recorder, the run directory, counting,
evaluation, divergence checks and videos. The commands built on it are :mod:`rlherd.commands`."""
