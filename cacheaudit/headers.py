"""Header fingerprints for cuda.core's `extra_digest`: the public name of
`cacheaudit.runtimes.cuda_core.headers` (see its docstring), which this module stands for.

    from cacheaudit.headers import fingerprint_headers
"""

import sys

from cacheaudit.runtimes.cuda_core import headers as _headers

sys.modules[__name__] = _headers
