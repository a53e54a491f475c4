"""`RealScheduler` for SGLang 0.5.16: 0.5.18's, the server settings installed as 0.5.16 installs
them (`runtime_context.get_context().set_server_args`; `publish` came in 0.5.17)."""

from __future__ import annotations

from typing import Any

from harness.real_scheduler import sglang_0_5_18


class RealScheduler(sglang_0_5_18.RealScheduler):
    @staticmethod
    def publish(runtime_context: Any, server_args: Any) -> None:
        runtime_context.get_context().set_server_args(server_args)
