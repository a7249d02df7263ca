"""Moved to tests/support/convert_reference.py; this name stays until every branch that imports it is merged."""
import sys

from tests.support import convert_reference

sys.modules[__name__] = convert_reference
