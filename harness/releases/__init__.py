"""Every SGLang release under test, one command: which releases a trace fails on.

  store     the release store: wheels fetched once, unpacked outside the checkout
  worker    one release in its own process: a trace replayed (or a fuzz) on each of its caches
  runner    the worker run once per release, several at a time
  history   the table, and the first failing, first fixed and regressed releases

`python -m harness releases TRACE [--from V] [--to V] [--json] [--fuzz SECONDS]` (`harness.cli`).
"""
