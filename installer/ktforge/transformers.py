"""``import ktforge.transformers``: the name users import for transformers' experts interface.

The engine itself lives in :mod:`ktforge.engines.transformers`; this name is that module, not a
copy (``ktforge.transformers is ktforge.engines.transformers``).
"""

import sys

from ktforge.engines import transformers as _engine
from ktforge.engines.transformers import *  # noqa: F403  (the public names, for type checkers)

sys.modules[__name__] = _engine
