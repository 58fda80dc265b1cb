"""Data: the swe-mini repositories, one text file each (format: ../repo.py)."""
