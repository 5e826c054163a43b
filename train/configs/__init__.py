"""Launch configs of the train commands (ml_collections ``get_config`` files, also loaded by
path: ``--config=train/configs/ppo.py``)."""
