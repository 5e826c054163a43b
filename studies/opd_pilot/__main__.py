"""``python -m studies.opd_pilot``: the study's command (flags and behaviour: ``studies.opd_pilot``'s docstring)."""
from prada_jax import cli
from studies.opd_pilot import main

if __name__ == "__main__":
    cli.run_local(main)
