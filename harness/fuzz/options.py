"""`FuzzOptions`: what one fuzz run does, checked before any work starts."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

from harness.caches import cache_class, cache_factory, cache_release, default_protocol
from harness.devices import best_device, check_device
from harness.fuzz.database import check_database
from harness.outputs import check_output_dir, check_output_file
from harness.findings import SetAside, set_aside
from harness.engines.hypothesis_engine import PENDING_DIR
from harness.profiles import PROFILES
from harness.trace import TraceError, set_aside_names
from harness.protocols import protocol_class
from strategies import SCENARIOS, Scenario
from strategies.config import SERVER_SETTINGS, CacheConfig, Setting, legal_refusal, servings_taken, setting_flags, setting_refusal

ENGINES = ("hypothesis", "random")


@dataclass
class FuzzOptions:
    seconds: float = 60.0
    device: str = field(default_factory=best_device)
    impl: str = "impl"
    protocol: Optional[str] = None  # None: the cache's own (the contract for impl, the release's for SGLang)
    profile: str = "nightly"
    configs: List[str] = field(default_factory=lambda: sorted(SCENARIOS))
    seed: Optional[int] = None
    db: Optional[str] = None  # directory (default .hypothesis/fuzz) or redis://host:port/n
    report: Optional[str] = None
    engine: str = "hypothesis"
    workers: int = 1
    fail_fast: bool = False  # stop at the first failure that fails the run
    fail_on_known: bool = False  # known findings fail the run too (else only new signatures do)
    trace_dir: str = field(default_factory=lambda: os.environ.get("HARNESS_TRACE_DIR") or PENDING_DIR)
    # known findings (`all`: every one of the release), failure signatures and trace files to set aside
    set_aside: List[str] = field(default_factory=list)
    # configurations `check` took out of `configs`: their settings are none the named protocol runs
    left_out: List[str] = field(default_factory=list)
    left_out_why: str = ""  # why, in a line
    # server settings pinned (None: drawn per program among those the cache and protocols take)
    mamba_strategy: Optional[str] = None
    event_loop: Optional[str] = None
    page_size: Optional[int] = None

    @property
    def pinned(self) -> Dict[str, Setting]:
        """The server settings pinned: `SERVER_SETTINGS` field -> value."""
        return {name: getattr(self, name) for name in SERVER_SETTINGS if getattr(self, name) is not None}

    @property
    def pinned_flags(self) -> str:
        """The pinned settings as the command line names them."""
        return setting_flags(self.pinned)

    def protocols_of(self, scenario: Scenario, factory: Any) -> List[type]:
        """The protocols a configuration's programs may run under: the one named, else the
        cache's own and, for settings that one cannot run, the hand-written one it falls back to."""
        own = protocol_class(self.protocol or default_protocol(factory))
        if self.protocol is None and not set(scenario.disaggregation) <= set(own.disaggregation_modes):
            return [own, protocol_class(cache_class(factory).default_protocol)]
        return [own]

    def scenario(self, name: str) -> Scenario:
        """Configuration `name` as this run draws it: its server settings drawn per program
        among SGLang's legal combinations (`SERVINGS`, weighted toward what SGLang serves by
        default) that agree with the pinned ones and that the cache and every protocol its
        programs may run under take (the cache's own, and the hand-written one it falls back to
        for settings the own cannot run). A pinned combination no taker takes is drawn as
        pinned: `check` refuses it."""
        scenario = SCENARIOS[name]
        factory = cache_factory(self.impl)
        protocols = self.protocols_of(scenario, factory)
        takers = [protocols[0].cache_settings_taken(factory)] + [p.settings_taken for p in protocols]
        servings = servings_taken(takers, self.pinned) or servings_taken([], self.pinned)
        return replace(scenario, servings=servings)

    def known_findings(self) -> SetAside:
        """What this run sets aside from the start (names checked against the release under test,
        trace files read for their failure's signature); a fresh object each call."""
        if not self.set_aside:
            return SetAside()
        factory = cache_factory(self.impl)
        return set_aside(set_aside_names(self.set_aside), cache_release(factory), self.scheduler_release(factory))

    def scheduler_release(self, factory: Any) -> Optional[str]:
        """The SGLang release whose own scheduler drives impl's tree in this run, if one does."""
        from harness.caches import ImplCache

        if (self.protocol or default_protocol(factory)) != "scheduler" or not issubclass(cache_class(factory), ImplCache):
            return None
        from harness.caches.sglang_loader import sglang_version

        return sglang_version()

    def check(self) -> None:
        """Raise ValueError naming the first unusable option."""
        unknown = [c for c in self.configs if c not in SCENARIOS]
        if unknown:
            raise ValueError(f"--config: unknown configuration(s) {unknown}; known: {sorted(SCENARIOS)}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be hypothesis or random, got {self.engine!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"--profile must be one of {list(PROFILES)}, got {self.profile!r}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"the budget must be a positive, finite number of seconds, got {self.seconds}")
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        factory = cache_factory(self.impl)
        try:
            self.known_findings()
        except TraceError as exc:
            raise ValueError(f"--set-aside: {exc}") from None
        protocol = protocol_class(self.protocol or default_protocol(factory))
        probe = None
        if self.pinned:
            for name, value in self.pinned.items():
                if value not in SERVER_SETTINGS[name][1]:
                    raise ValueError(f"{setting_flags({name: value}).split()[0]} must be one of {list(SERVER_SETTINGS[name][1])}, got {value!r}")
            illegal = legal_refusal(self.pinned)
            if illegal:
                raise ValueError(f"{self.pinned_flags}: {illegal}")
            # the protocol and cache must take the pinned settings in some legal combination
            settings = dict(servings_taken([], self.pinned)[0])
            probe = CacheConfig(kv_size=settings["page_size"], mamba_size=1, req_size=1, **settings)
        refusal = protocol.refusal(factory, None, probe)
        if refusal:
            raise ValueError(refusal)
        if self.protocol is not None:  # else a program it cannot run takes the hand-written calls
            self._leave_out_unrunnable(protocol)
        elif self.pinned:  # ... which must take the pinned settings too
            self._leave_out_unpinnable(factory)
        check_device(self.device)
        if self.engine == "hypothesis":
            check_database(self.db)
        if self.report:
            check_output_file("--report", self.report)
        check_output_dir("--trace-dir", self.trace_dir)

    def _leave_out_unrunnable(self, protocol: type) -> None:
        """Take out of `configs` those whose settings the protocol cannot run (a disaggregation
        mode it lacks); ValueError when none is left."""
        runnable = [c for c in self.configs if set(SCENARIOS[c].disaggregation) & set(protocol.disaggregation_modes)]
        self.left_out = [c for c in self.configs if c not in runnable]
        self.left_out_why = f"{protocol.title()} runs disaggregation modes {list(protocol.disaggregation_modes)} only"
        if not runnable:
            raise ValueError(f"--config: {protocol.title()} runs none of {self.configs} (it runs disaggregation modes {list(protocol.disaggregation_modes)})")
        self.configs = runnable

    def _leave_out_unpinnable(self, factory: Any) -> None:
        """Take out of `configs` those some of whose programs would fall back to a protocol that
        does not take the pinned server settings; ValueError when none is left."""
        def takes(config: str) -> bool:
            return all(not setting_refusal(p.settings_taken, self.pinned) for p in self.protocols_of(SCENARIOS[config], factory))

        runnable = [c for c in self.configs if takes(c)]
        self.left_out = [c for c in self.configs if c not in runnable]
        fallback = protocol_class(cache_class(factory).default_protocol)
        self.left_out_why = (f"their settings fall back to the {cache_class(factory).default_protocol} protocol, "
                             f"which runs {setting_refusal(fallback.settings_taken, self.pinned)}")
        if not runnable:
            raise ValueError(f"--config: none of {self.configs} runs with {self.pinned_flags} ({self.left_out_why})")
        self.configs = runnable
