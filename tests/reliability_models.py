"""Moved to tests/support/reliability_models.py; this name stays until every branch that imports it is merged."""
import sys

from tests.support import reliability_models

sys.modules[__name__] = reliability_models
