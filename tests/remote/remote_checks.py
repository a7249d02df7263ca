"""Moved to tests/support/remote_checks.py; this name stays until every branch that imports it is merged."""
import sys

from tests.support import remote_checks

sys.modules[__name__] = remote_checks
