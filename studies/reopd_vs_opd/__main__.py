"""``python -m studies.reopd_vs_opd``: the study's command (flags and behaviour: ``studies.reopd_vs_opd``'s docstring)."""
from prada_jax import cli
from studies.reopd_vs_opd import main

if __name__ == "__main__":
    cli.run_local(main)
