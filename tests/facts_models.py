"""Moved to tests/support/facts_models.py; this name stays until every branch that imports it is merged."""
import sys

from tests.support import facts_models

sys.modules[__name__] = facts_models
