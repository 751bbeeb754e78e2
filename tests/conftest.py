# pytest rewrites the asserts of test modules, so that they hold under `python -O` too; the
# shared helpers' asserts need the same.
import pytest

pytest.register_assert_rewrite("data_tools")
