"""Skip markers for the parts bagua_core._C can be built without.

BAGUA_TEST_BINDINGS=OFF (CMakeLists.txt) leaves out the test-only entry points
(`_C._half_convert`, `_C.kernels`, the averager's `_test_*` hooks, ...): a release
build then skips the tests that drive them instead of failing.
"""

import pytest

from bagua_core import _C

HAS_TEST_BINDINGS = bool(getattr(_C, "_test_bindings", True))

needs_test_bindings = pytest.mark.skipif(
    not HAS_TEST_BINDINGS,
    reason="bagua_core._C was built with -DBAGUA_TEST_BINDINGS=OFF: its test-only entry points are absent",
)
