"""Pre-registered studies: command, registration, verdict, per-seed JSON (DESIGN.md §1)."""
