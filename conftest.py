"""Project-wide pytest setup: Hypothesis profiles, `--device`, `--cache-impl`, `--protocol`, the
`gpu` and `sglang` markers.

Profiles (pick with `--hypothesis-profile NAME`; default `ci` when CI is set, else `dev`):
  dev      quick local runs, with the local example database
  ci       what CI runs: Hypothesis' built-in `ci` profile (derandomized, no database) plus our sizes
  nightly  long programs, many examples, a database kept between runs

`--cache-impl impl|sglang|sglang-CORE|MODULE:CLASS` picks the cache the state machine and the
regression traces run against (default `impl`); `sglang` runs them against every cache of the
installed release (its MambaRadixCache where it ships one, its UnifiedRadixCache on the Python and
on the Rust tree core where it ships that). `--protocol` picks the scheduler that drives it
(default the cache's own). Tests marked `sglang` need SGLang importable and skip, saying why,
when it is not.
"""

import os

import pytest
import torch
from hypothesis import settings

from harness.caches import cache_factory, sglang_caches
from harness.caches.sglang_loader import sglang_unavailable
from harness.devices import check_device
from harness.profiles import PROFILES, register_profiles
from harness.protocols import protocol_class

register_profiles()


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device for the cache under test (cpu or cuda); default cpu",
    )
    parser.addoption(
        "--cache-impl",
        default="impl",
        help="cache under test: impl (default), sglang (SGLang's own, when installed) or MODULE:CLASS",
    )
    parser.addoption(
        "--protocol",
        default=None,
        help="scheduler protocol driving it (default: the cache's own: contract for impl, the release's for sglang)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Check every option before Hypothesis' own plugin loads a profile (an unknown one there is
    an INTERNALERROR): one line naming the option and the value."""
    env_profile = os.environ.get("HYPOTHESIS_PROFILE")
    for source, name in (("HYPOTHESIS_PROFILE", env_profile), ("--hypothesis-profile", config.getoption("hypothesis_profile", None))):
        if name is not None and name not in PROFILES:
            raise pytest.UsageError(f"{source}={name}: unknown Hypothesis profile; known: {', '.join(PROFILES)}")
    settings.load_profile(env_profile or ("ci" if os.environ.get("CI") else "dev"))
    try:
        check_device(config.getoption("--device"))
        cache_factory(config.getoption("--cache-impl"))
        if config.getoption("--protocol") is not None:
            protocol_class(config.getoption("--protocol"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc).replace("--impl", "--cache-impl"))


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    sglang_missing = sglang_unavailable() if any("sglang" in item.keywords for item in items) else ""
    skip_sglang = pytest.mark.skip(reason=f"needs SGLang: {sglang_missing}")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "sglang" in item.keywords and sglang_missing:
            item.add_marker(skip_sglang)


def pytest_generate_tests(metafunc):
    """`--cache-impl sglang`: each test taking the cache under test runs once per cache of the
    installed release (`harness.caches.sglang_caches`)."""
    if "cache_impl" in metafunc.fixturenames and metafunc.config.getoption("--cache-impl") == "sglang":
        names = sglang_caches()
        if len(names) > 1:
            metafunc.parametrize("cache_impl", names)


@pytest.fixture
def device(request) -> torch.device:
    """The torch device the cache under test runs on (`--device`)."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def cache_impl(request) -> str:
    """The name of the cache under test (`--cache-impl`)."""
    return request.config.getoption("--cache-impl")


@pytest.fixture
def cache_under_test(cache_impl):
    """Builds the cache under test from a `CacheConfig`."""
    return cache_factory(cache_impl)


@pytest.fixture
def protocol(request):
    """The scheduler protocol the state machine runs (`--protocol`; None: the cache's own)."""
    return request.config.getoption("--protocol")
