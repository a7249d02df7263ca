"""Moved to tests/support/safetensors_corpus.py; this name stays until every branch that imports it is merged."""
import sys

from tests.support import safetensors_corpus

sys.modules[__name__] = safetensors_corpus
