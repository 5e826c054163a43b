"""Stage 2 of PRADA: learning the admission prices of the server's threshold rule (docs/dual.md)."""
