"""The linear weights' formats, by name (linear.py says what each runs on and which is the default).
Without torch: the command line lists them (core/config.py) before torch loads."""

QUANTIZATIONS = ("none", "int8", "int4")
