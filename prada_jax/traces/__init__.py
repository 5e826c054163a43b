"""Step traces: format, loading/validation, synthetic generator, real builder (torch extra)."""
from prada_jax.traces.format import (FORMAT_VERSION, TraceFormatError, TraceSet, load, read_meta,
                                     save, validate, validate_arrays)

__all__ = ["FORMAT_VERSION", "TraceFormatError", "TraceSet", "load", "read_meta", "save",
           "validate", "validate_arrays"]
