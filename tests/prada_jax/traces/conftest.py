"""Puts this folder on ``sys.path`` (pytest's prepend import mode does so for a conftest's
folder), so the tiny Hugging Face model fixtures in ``test_build_fixtures.py`` import by name
from ``test_prm.py`` and from the builder's tests in ``build/``."""
