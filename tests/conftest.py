"""Lets tests import their helper modules (e.g. `broken_impls`) by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
