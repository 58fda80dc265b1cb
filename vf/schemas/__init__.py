"""Published JSON schemas (data files)."""
