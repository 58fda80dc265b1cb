__version__ = "0.1.0"

# The on-disk trace format version written on every record.
TRACE_VERSION = 1
