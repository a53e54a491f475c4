"""How `bench.mutation_report` sorts a mutant that was not killed, from mutmut's diff."""

from bench.mutation_report import kind_of

HEADER = "--- impl/x.py\n+++ impl/x.py\n@@ -1,6 +1,6 @@\n"


def test_a_changed_default_in_a_signature_is_a_default():
    diff = HEADER + " def f(\n-    size: int = 1,\n+    size: int = 2,\n ):\n     return size\n"
    assert kind_of("survived", diff) == "default"


def test_a_changed_string_is_a_message():
    diff = HEADER + " def f(x):\n-    raise ValueError(f'bad {x}')\n+    raise ValueError(None)\n"
    assert kind_of("survived", diff) == "message"


def test_a_signature_cut_off_by_the_diff_context_is_judged_by_the_change_alone():
    diff = HEADER + " def f(\n     a,\n-    b = a + 1\n+    b = a + 2\n"
    assert kind_of("survived", diff) == "behaviour"


def test_a_mutant_no_test_runs_is_not_reached():
    assert kind_of("no tests", HEADER) == "not reached"
