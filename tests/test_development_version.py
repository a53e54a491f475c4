"""A development version of SGLang (an editable install of a checkout): driven by the newest
release's adapter after a check of the calls it makes, or refused in one line naming the call."""

import os
import subprocess
import sys

import pytest

from harness.caches.sglang_api import _mismatch
from harness.caches.sglang_loader import sglang_unavailable, sglang_version
from harness.caches.sglang_releases import RELEASES, default_tree_core, is_development, serves_unified, ships_mamba_radix_cache

ROOT = os.path.dirname(os.path.dirname(__file__))
DEV = "0.5.24.dev3+g1234abc"


def test_a_version_after_the_newest_release_is_a_development_version_served_as_the_newest():
    assert is_development(DEV) and is_development("0.6.0")
    assert not is_development(RELEASES[-1]) and not is_development("0.0.0.dev0") and not is_development("not a version")
    assert serves_unified(DEV) and not ships_mamba_radix_cache(DEV) and default_tree_core(DEV) == default_tree_core(RELEASES[-1])


def test_a_moved_call_is_named():
    def release_kv_cache(req, tree_cache, *, checkpoint): ...
    def renamed(req, tree_cache, *, do_checkpoint): ...
    def more(req, tree_cache, extra, *, checkpoint): ...
    def fewer(req): ...
    assert _mismatch(release_kv_cache, ("*2", "checkpoint")) is None
    assert _mismatch(renamed, ("*2", "checkpoint")) == "no parameter 'checkpoint'"
    assert _mismatch(more, ("*2", "checkpoint")) == "a new parameter without a default, 'extra'"
    assert _mismatch(fewer, ("*2",)) == "it takes 1 positional argument(s), the adapter passes 2"


PROBE = """
from harness.caches.sglang_loader import CUDA_ONLY_PACKAGES, _placeholder
for package in CUDA_ONLY_PACKAGES:  # as the loader does, before SGLang's first import
    _placeholder(package)
import sglang
sglang.__version__ = {version!r}
{change}
from harness.caches.sglang_loader import development_note, sglang_unavailable
reason = sglang_unavailable()
print(reason or development_note(sglang.__version__))
"""


def probe(version, change=""):
    code = PROBE.format(version=version, change=change)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, SGLANG_MAMBA_SSM_DTYPE="float32")).stdout.strip().splitlines()[-1]


@pytest.fixture
def newest_installed():
    if sglang_unavailable() or sglang_version() != RELEASES[-1]:
        pytest.skip(f"stands in a development version with the newest release's code: needs SGLang {RELEASES[-1]} installed")


@pytest.mark.sglang
def test_a_development_version_is_accepted_and_says_how_it_is_driven(newest_installed):
    assert probe(DEV) == (
        f"SGLang {DEV} is a development version: driven by the adapter, scheduler protocol and rules of {RELEASES[-1]}, "
        f"the newest release the harness knows (its API checked against {RELEASES[-1]}'s calls)"
    )


@pytest.mark.sglang
def test_a_development_version_whose_api_moved_is_refused_naming_the_call(newest_installed):
    change = ("import sglang.srt.mem_cache.common as common\n"
              "def release_kv_cache(req, tree_cache, *, do_checkpoint): pass\n"
              "common.release_kv_cache = release_kv_cache")
    assert probe(DEV, change) == (
        f"SGLang {DEV}: the signature of sglang.srt.mem_cache.common.release_kv_cache changed since {RELEASES[-1]}: "
        f"no parameter 'checkpoint'; the harness's adapter makes {RELEASES[-1]}'s calls"
    )


@pytest.mark.sglang
def test_a_checkout_installed_without_its_version_is_refused():
    if sglang_unavailable():
        pytest.skip("needs SGLang installed")
    assert probe("0.0.0.dev0").startswith("SGLang 0.0.0.dev0 is installed, but the harness drives")
