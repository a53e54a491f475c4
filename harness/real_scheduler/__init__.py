"""The release's own `Scheduler`, built in this process with a stand-in model worker.

  sglang_0_5_23   SGLang 0.5.23's `Scheduler` (`RealScheduler`): the release's event loop, its
                  scheduler components and its invariant checker, driven one turn at a time;
                  0.5.22's scheduler offers the same seams and is built by it unchanged
  sglang_0_5_21   0.5.21's: the same builder, its forward pass reading 0.5.21's extend range
  sglang_0_5_20   0.5.20's: 0.5.21's, the process groups set up by the stand-in worker (0.5.20's
                  model runner did), the settings published and the ranks passed as 0.5.20 takes them
  sglang_0_5_19   0.5.19's: 0.5.20's, a turn ending at its loop's receive, the model runner's
                  copy-on-write made in the Mamba pool
  sglang_0_5_18   0.5.17's and 0.5.18's: 0.5.19's, the settings handed to the n-gram manager
  sglang_0_5_16   0.5.16's: 0.5.18's, the settings installed without `publish`

The protocol that drives it is `harness.protocols.scheduler` (`--protocol scheduler`);
`docs/scheduler-protocol.md`, "The release's own scheduler", lists the releases it is built for
and why the others are not.
"""

from __future__ import annotations

import importlib

# the releases whose own scheduler is built here, and the module building each
RELEASES = {
    "0.5.16": "harness.real_scheduler.sglang_0_5_16",
    "0.5.17": "harness.real_scheduler.sglang_0_5_18",
    "0.5.18": "harness.real_scheduler.sglang_0_5_18",
    "0.5.19": "harness.real_scheduler.sglang_0_5_19",
    "0.5.20": "harness.real_scheduler.sglang_0_5_20",
    "0.5.21": "harness.real_scheduler.sglang_0_5_21",
    "0.5.22": "harness.real_scheduler.sglang_0_5_23",
    "0.5.23": "harness.real_scheduler.sglang_0_5_23",
}


def real_scheduler_class(version: str) -> type:
    """The `RealScheduler` built for SGLang `version`; ValueError naming the releases there is
    one for otherwise."""
    if version not in RELEASES:
        raise ValueError(f"--protocol scheduler: the release's own scheduler is built for SGLang {sorted(RELEASES)} only, not {version}")
    return importlib.import_module(RELEASES[version]).RealScheduler
