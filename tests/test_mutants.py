"""The seeded-bug catalogue: every mutant still applies to `impl/`, patches are undone, and the
harness catches every one under the `ci` profile (the promise of `python -m bench.mutants`).

A mutant that stops being caught fails here: a check was weakened, or the driver stopped
reaching the code the bug lives in.
"""

import io

import pytest

from bench.mutants import BY_NAME, MUTANTS, Mutant, MutantError, applied
from bench.mutants.__main__ import main
from bench.mutants.hunt import HUNT_ORDER, HuntUnavailable, hunt
from impl import MambaRadixCache

AREAS = {
    "lock accounting", "LRU refresh order", "node split", "tombstone cascade", "evict loop",
    "evict_mamba internal", "cow_mamba", "chunked prefill", "size counters", "pools",
    "meaning", "memory", "ownership", "extra buffer and pages",
}


def test_catalogue_has_at_least_25_mutants_over_every_area():
    assert len(MUTANTS) >= 25
    assert {m.area for m in MUTANTS} == AREAS


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_applies_to_the_current_source_and_changes_the_code(mutant):
    owner, attr = mutant.owner_and_attr()
    original = vars(owner)[attr]
    before = getattr(original, "__func__", original).__code__
    with applied(mutant):
        after = vars(owner)[attr].__code__
        assert (after.co_code, after.co_consts) != (before.co_code, before.co_consts)
    assert vars(owner)[attr] is original


def test_applied_restores_the_original_when_the_block_raises():
    mutant = BY_NAME["evict-one-short"]
    original = MambaRadixCache.evict
    with pytest.raises(RuntimeError, match="inside"):
        with applied(mutant):
            assert MambaRadixCache.evict is not original
            raise RuntimeError("inside")
    assert MambaRadixCache.evict is original


def test_a_stale_edit_is_refused_naming_the_mutant():
    stale = Mutant("stale", "evict loop", "impl.mamba_radix_cache:MambaRadixCache.evict",
                   (("this text is not in evict", "x"),), "no longer fits")
    with pytest.raises(MutantError, match=r"mutant stale: 'this text is not in evict' occurs 0 times"):
        stale.build()


@pytest.mark.parametrize(
    "target, message",
    [
        ("impl.mamba_radix_cache", r"is not 'module:qualname'"),
        ("impl.mamba_radix_cache:MambaRadixCache.no_such_method", r"has no attribute 'no_such_method'"),
    ],
)
def test_a_bad_target_is_refused_naming_it(target, message):
    with pytest.raises(MutantError, match=message):
        Mutant("bad", "pools", target, (("a", "b"),), "bad target").build()


@pytest.mark.parametrize("name", [m.name for m in MUTANTS])
def test_seeded_bug_is_caught_under_the_ci_profile(name):
    try:
        result = hunt(name, engine="hypothesis", profile="ci", device="cpu")
    except HuntUnavailable as why:  # a path only SGLang's own scheduler runs (the extra buffer, pages)
        pytest.skip(str(why))
    assert result.caught, f"seeded bug {name} survived every configuration of {HUNT_ORDER}"
    # a trace was written and loads; it may hold no operation (a bug visible in the pools as built
    # fails the check before the first step)
    assert result.trace_operations is not None and result.config in HUNT_ORDER


# each check added to judge data, memory and ownership, with the seeded bug only it catches and
# the check that reports it (overwriting what the cache was handed makes a kept tensor visible to
# the structure checks)
CAUGHT_ALONE = {
    "fork-of-the-cached-prefix": ("meaning", "meaning"),
    "reset-keeps-tree-linked": ("node_reclaimed", "node_reclaimed"),
    "finished-mamba-slot-int32": ("index_types", "index_types"),
    "fork-views-free-list": ("own_storage", "own_storage"),
    "insert-keeps-callers-tensors": ("handed_tensors", "trees_equal"),
}


@pytest.mark.parametrize("name, check, reported", sorted((n, *c) for n, c in CAUGHT_ALONE.items()))
def test_each_new_check_alone_catches_its_seeded_bug(name, check, reported):
    from harness.driver import CHECKS

    caught = hunt(name, engine="random", profile="ci", device="cpu")
    assert caught.caught and caught.check == reported, caught
    without = hunt(name, engine="random", profile="ci", device="cpu", checks=CHECKS - {check})
    assert not without.caught, f"{name} is caught without {check} too, by {without.check}"


def test_mutants_command_prints_the_row_and_exits_zero_when_caught():
    out = io.StringIO()
    assert main(["--only", "evict-one-short", "--workers", "1", "--device", "cpu"], out=out) == 0
    text = out.getvalue()
    assert "| `evict-one-short` | evict loop | yes |" in text
    assert "1/1 seeded bugs caught (hypothesis engine, ci profile, cpu)" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "no-such-bug"], "unknown mutant(s) ['no-such-bug']"),
        (["--profile", "weekly"], "invalid choice: 'weekly'"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--device", "gpu0"], "not a torch device: 'gpu0'"),
    ],
)
def test_mutants_command_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv, out=io.StringIO())
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
