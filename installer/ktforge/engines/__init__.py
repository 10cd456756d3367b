"""The engines ktforge plugs into, one subpackage each: ``transformers`` (the experts interface,
``experts_implementation="ktforge"``; users import it as ``ktforge.transformers``) and ``vllm``
(a ``vllm.general_plugins`` plugin).

Each engine's package imports the kernels (:mod:`ktforge.kernels`), the checkpoint readers
(:mod:`ktforge.checkpoints`) and its own engine: never another engine, and the kernels never
import an engine (tests/test_structure.py holds both).
"""
