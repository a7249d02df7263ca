"""The benchmark's rows, one module each (``bench/run.py`` runs them); ``common`` and
``models`` are what they share."""
