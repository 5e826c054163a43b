"""``python -m studies.real_smollm2 --step=prm|chats|student|curve``: see ``studies.real_smollm2``."""
from prada_jax import cli
from studies.real_smollm2 import main

if __name__ == "__main__":
    cli.run_local(main)
