"""Moved to tests/support/gguf_corpus.py; this name stays until every branch that imports it is merged."""
import sys

from tests.support import gguf_corpus

sys.modules[__name__] = gguf_corpus
