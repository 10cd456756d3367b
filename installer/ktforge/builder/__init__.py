"""Building kernels for this machine: the backend table, recipes, the planner, the executor
and verification, the build record, system packages."""
