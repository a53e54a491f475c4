"""Project-wide pytest setup: Hypothesis profiles, `--device`, `--cache-impl`, the `gpu` and
`sglang` markers.

Profiles (pick with `--hypothesis-profile NAME`; default `ci` when CI is set, else `dev`):
  dev      quick local runs, with the local example database
  ci       what CI runs: Hypothesis' built-in `ci` profile (derandomized, no database) plus our sizes
  nightly  long programs, many examples, a database kept between runs

`--cache-impl impl|sglang|MODULE:CLASS` picks the cache the state machine and the regression
traces run against (default `impl`). Tests marked `sglang` need SGLang importable and skip,
saying why, when it is not.
"""

import os

import pytest
import torch
from hypothesis import settings

from harness.adapters import adapter_for
from harness.config import check_device
from harness.profiles import register_profiles
from harness.sglang_adapter import sglang_unavailable

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device for the implementation under test (cpu or cuda); default cpu",
    )
    parser.addoption(
        "--cache-impl",
        default="impl",
        help="cache under test: impl (default), sglang (SGLang's MambaRadixCache) or MODULE:CLASS",
    )


def pytest_configure(config):
    try:
        check_device(config.getoption("--device"))
        adapter_for(config.getoption("--cache-impl"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc))


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    sglang_missing = sglang_unavailable() if any("sglang" in item.keywords for item in items) else ""
    skip_sglang = pytest.mark.skip(reason=f"needs SGLang: {sglang_missing}")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "sglang" in item.keywords and sglang_missing:
            item.add_marker(skip_sglang)


@pytest.fixture
def device(request) -> torch.device:
    """The torch device the implementation under test runs on (`--device`)."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def cache_impl(request) -> str:
    """The name of the cache under test (`--cache-impl`)."""
    return request.config.getoption("--cache-impl")


@pytest.fixture
def adapter_factory(cache_impl):
    """Builds the adapter of the cache under test from a `CacheConfig`."""
    return adapter_for(cache_impl)
