"""Project-wide pytest setup: Hypothesis profiles, the `--device` option and the `gpu` marker.

Profiles (pick with `--hypothesis-profile NAME`; default `ci` when CI is set, else `dev`):
  dev      quick local runs, with the local example database
  ci       what CI runs: Hypothesis' built-in `ci` profile (derandomized, no database) plus our sizes
  nightly  long programs, many examples, a database kept between runs
"""

import os

import pytest
import torch
from hypothesis import settings

from harness.profiles import register_profiles

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device for the implementation under test (cpu or cuda); default cpu",
    )


def pytest_configure(config):
    device = config.getoption("--device")
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise pytest.UsageError(f"--device: not a torch device: {device!r}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {device}: CUDA is not available on this machine")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device(request) -> torch.device:
    """The torch device the implementation under test runs on (`--device`)."""
    return torch.device(request.config.getoption("--device"))
