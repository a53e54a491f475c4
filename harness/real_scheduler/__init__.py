"""The release's own `Scheduler`, built in this process with a stand-in model worker.

  sglang_0_5_23   SGLang 0.5.23's `Scheduler` (`RealScheduler`): the release's event loop, its
                  scheduler components and its invariant checker, driven one turn at a time

Not yet a protocol of the harness (`harness.protocols`): see `docs/scheduler-protocol.md`,
"The release's own scheduler", for what exists and what is still to build.
"""
