"""Pre-registered studies: command, registration, verdict, per-seed JSON (docs/design.md §1)."""
