"""``python -m studies.reopd_prefix_source``: the study's command (flags and behaviour: ``studies.reopd_prefix_source``'s docstring)."""
from prada_jax import cli
from studies.reopd_prefix_source import main

if __name__ == "__main__":
    cli.run_local(main)
