"""The serving engines ktforge plugs into, one subpackage each (``vllm``).

Each engine's package imports only the kernels (:mod:`ktforge.kernels`) and its own engine:
never another engine, and the kernels never import an engine.
"""
