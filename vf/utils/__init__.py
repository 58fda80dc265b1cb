"""Small helpers for environment authors (`vf.utils.image`)."""
