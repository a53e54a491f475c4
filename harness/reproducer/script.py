"""`replay TRACE --to-script`: a failure found on SGLang as one standalone Python file.

The trace is replayed on the SGLang cache it was recorded on with a `Recorder` installed, so the
file holds exactly the calls the adapter made: the pools and the cache built as the adapter builds
them, the scheduler's calls, and the writes it makes to its request records (the stand-in classes
it hands SGLang are copied in). It imports only SGLang, torch and the standard library, and ends
with what broke:

  an exception raised inside an SGLang call   that call, made bare: the script dies with it
  own_storage                                 no tree tensor shares storage with a free list or
                                              the request rows
  index_types                                 every tree tensor is int64 on the pools' device
  node_reclaimed                              once the script lets go of its own names, no node
                                              that left the tree is alive (reference counting
                                              alone, the cyclic collector off, freed it)

Other checks (the model's structure, pool conservation, what data means) are stated by the model,
which the file cannot carry: they are refused with a `ScriptError` naming the check. A known
finding's summary goes into the file's docstring as what is expected and what happens.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional

from harness.caches import CacheFactory, cache_class
from harness.reproducer.record import Recorder, ScriptError, attributes_of
from harness.signature import EXCEPTION, INVARIANT, Signature
from harness.findings import KnownFinding
from harness.trace import Trace, finding_of, replay, replay_protocol

SUPPORTED_INVARIANTS = ("own_storage", "index_types", "node_reclaimed")

PRELUDE = '''
import gc
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import time
import types
import weakref
from typing import Any, Hashable, List, Optional, Sequence

import torch

os.environ.setdefault("SGLANG_MAMBA_SSM_DTYPE", "float32")
DEVICE = os.environ.get("REPRO_DEVICE", "cpu")


class _Placeholder(types.ModuleType):
    """A CUDA-only package SGLang's imports name but the cache never calls (a CPU machine)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        raise ImportError(f"{self.__name__} is a placeholder: not installed here")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.package or fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = "0.0"


for _package in ("torchvision", "sgl_kernel"):
    try:
        importlib.import_module(_package)
    except ImportError:
        sys.meta_path.insert(0, _PlaceholderFinder(_package))
'''

NODE_HELPERS = '''

def tree_nodes(root):
    """Every node under `root` (children dicts), root first."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def node_tensors(node):
    """The index tensors a node holds, with their fields (a unified node's per component)."""
    for name, value in vars(node).items():
        if isinstance(value, torch.Tensor):
            yield name, value
    components = getattr(node, "component_data", None) or {}
    for component, data in (components.items() if isinstance(components, dict) else enumerate(components)):
        for name, value in vars(data).items():
            if isinstance(value, torch.Tensor):
                yield f"{component}.{name}", value


def nodes_left_alive(root):
    """The nodes seen in the tree at the end of some step that are no longer in it but alive,
    each with the nodes' fields that refer to it."""
    in_tree = {id(node) for node in tree_nodes(root)}
    out = []
    for node in list(seen):
        if id(node) not in in_tree:
            holders = [f"{type(h).__name__}.{k}" for h in list(seen) for k, v in vars(h).items()
                       if v is node or (isinstance(v, dict) and any(c is node for c in v.values()))]
            out.append(f"node {node.key}, referred to by {sorted(set(holders)) or 'a reference cycle'}")
    return out
'''


def to_script(trace: Trace, factory: CacheFactory, source: str, protocol: Optional[str] = None) -> str:
    """The reproducer of `trace`'s failure under `protocol` (default: the one a replay takes; see
    the module docstring); ScriptError why not."""
    if not trace.impl.startswith("sglang"):
        raise ScriptError(f"{source} was recorded on {trace.impl}, not on SGLang: --to-script writes SGLang reproducers")
    if replay_protocol(trace, factory, protocol) == "scheduler":
        raise ScriptError(
            f"{source} runs under the release's own scheduler, whose in-process build a script cannot write: "
            f"--protocol {cache_class(factory).default_protocol} writes the hand-written calls of its release, "
            "where the failure reproduces under them"
        )
    if trace.failure is None:
        raise ScriptError(f"{source} records no failure: nothing to reproduce")
    signature = trace.failure.signature
    if signature is None:  # a trace from before signatures: the failure it produces where it was recorded
        verdict = replay(trace, factory)
        if verdict.ok:
            raise ScriptError(f"{source} passes on {trace.impl} {trace.impl_version}: nothing to reproduce")
        signature = verdict.failure.signature
    if signature.kind == INVARIANT and signature.check not in SUPPORTED_INVARIANTS:
        raise ScriptError(
            f"{source}: --to-script states {', '.join(SUPPORTED_INVARIANTS)} and exceptions raised in SGLang as "
            f"standalone checks, not {signature.check} (the model states it)"
        )
    if signature.kind == EXCEPTION and (signature.where.startswith("scheduler.") or signature.where == "the harness"):
        raise ScriptError(f"{source}: {signature.check} was raised by {signature.where}, not by an SGLang call: no standalone form")
    if signature.kind not in (INVARIANT, EXCEPTION):
        raise ScriptError(f"{source}: a disagreement with the model ({signature.what}) has no standalone form")
    recorder, verdict, cut = _record(trace, factory, protocol)
    if verdict.ok or verdict.failure.signature is None or not verdict.failure.signature.same_as(signature):
        got = "passes" if verdict.ok else f"fails as {verdict.failure.signature.key}"
        raise ScriptError(f"{source}: recorded again with its calls written down, it {got}, not as {signature.key}")
    body = _body(recorder, verdict.error, signature)
    if signature.kind == INVARIANT:
        body += _property(recorder, cut, signature)
    return _document(trace, signature, recorder, body, finding_of(trace, factory))


def _record(trace: Trace, factory: CacheFactory, protocol: Optional[str] = None):
    from harness.caches.sglang_loader import VirtualClock, load_sglang
    from harness.caches.sglang_0_5_4 import SglangReq
    from harness.caches.sglang_0_5_20 import Req0520
    from harness.driver import Driver
    from harness.pairing import PairedCaches

    sgl = load_sglang()
    recorder = Recorder()
    undo_namespace = recorder.wrap_namespace(sgl)
    for stand_in in (SglangReq, Req0520, VirtualClock):
        recorder.wrap_stand_in(stand_in)
    built: Dict[str, Any] = {}
    original_check = Driver.check

    def check(driver: Driver) -> None:
        built["cut"] = driver.cut
        with recorder.paused():
            original_check(driver)

    def on_step(step: int, entry: Dict[str, Any], driver: Driver) -> None:
        recorder.emit(f"# end of step {step}: {entry['op']}({', '.join(f'{k}={v!r}' for k, v in entry['args'].items())})")

    original_overwrite = PairedCaches._overwrite

    def overwrite(caches: PairedCaches, *handed: Any) -> None:
        if caches.overwrite_handed:
            for tensor in handed:
                recorder.overwritten(tensor)
        original_overwrite(caches, *handed)

    Driver.check, PairedCaches._overwrite = check, overwrite
    try:
        verdict = replay(trace, factory, protocol=protocol, on_step=on_step)
    finally:
        Driver.check, PairedCaches._overwrite = original_check, original_overwrite
        recorder.undo()
        undo_namespace()
    if isinstance(verdict.error, ScriptError):
        raise verdict.error
    if "cut" not in built:
        raise ScriptError(f"the cache could not be built while recording: {verdict.failure.message if verdict.failure else ''}")
    return recorder, verdict, built["cut"]


def _body(recorder: Recorder, error: Optional[BaseException], signature: Signature) -> List[str]:
    """The statements; a call that raised is caught as the scheduler caught it, except the one
    that is the failure (made bare, last)."""
    failing = set()
    chain = error
    while chain is not None:
        failing.add(id(chain))
        chain = chain.__cause__ or chain.__context__
    lines: List[str] = []
    for statement in recorder.statements:
        if statement.raised is not None and id(statement.raised) in failing and signature.kind == EXCEPTION:
            lines += [
                "",
                f"# THE FAILURE: expected to return; raises {type(statement.raised).__name__}: "
                f"{str(statement.raised).splitlines()[0][:200] if str(statement.raised) else ''}",
                statement.code,
                "print('OK: the call returned')",
            ]
            return lines
        if statement.raised is not None:
            indented = statement.code
            lines += ["try:", f"    {indented}", "except Exception:  # raised here too when recorded: the scheduler went on", "    pass"]
        else:
            lines.append(statement.code)
    if signature.kind == EXCEPTION:
        raise ScriptError("the call that raised was not made by the adapter itself (an SGLang call made it inside)")
    return lines


def _property(recorder: Recorder, cut: Any, signature: Signature) -> List[str]:
    cache = recorder.name_of(cut.cache)
    if cache is None:
        raise ScriptError("the cache was not built through the calls recorded")
    root = f"{cache}.root_node" if hasattr(cut.cache, "root_node") else f"{cache}.tree_core.root_node"
    lines = ["", f"# THE PROPERTY that broke: {signature.check} ({signature.what})"]
    if signature.check != "node_reclaimed":
        lines.append(f"nodes = tree_nodes({root})")
    if signature.check == "own_storage":
        foreign = [(_attribute_expr(recorder, t), t) for t in cut.free_list_tensors()] + [(_attribute_expr(recorder, cut.request_rows()), None)]
        lines += ["foreign = {"]
        lines += [f"    {expr}.untyped_storage().data_ptr(): {expr!r}," for expr, _ in foreign]
        lines += [
            "}",
            "for node in nodes[1:]:",
            "    for field, tensor in node_tensors(node):",
            "        owner = foreign.get(tensor.untyped_storage().data_ptr())",
            "        assert owner is None, (",
            "            f\"node {list(node.key.token_ids) if hasattr(node.key, 'token_ids') else node.key}: its {field} is a view \"",
            "            f\"of {owner}, memory the tree does not own (it keeps that whole tensor alive)\"",
            "        )",
        ]
    elif signature.check == "index_types":
        lines += [
            "for node in nodes[1:]:",
            "    for field, tensor in node_tensors(node):",
            "        assert tensor.dtype == torch.int64 and tensor.device == torch.device(DEVICE), (",
            "            f\"node {node.key}: its {field} is {tensor.dtype} on {tensor.device}, not torch.int64 on {DEVICE}\"",
            "        )",
        ]
    else:  # node_reclaimed
        keep = sorted({cache} | {n for n in (recorder.name_of(cut.req_pool), recorder.name_of(cut.kv)) if n})
        lines += [
            "# this script's own names for requests, matches and nodes let go: what is still alive of a node",
            "# that left the tree is kept so only by other nodes",
            f"for _name in [n for n in list(globals()) if re.fullmatch(r'[vrt][0-9]+', n) and n not in {keep!r}]:",
            "    del globals()[_name]",
            f"stray = nodes_left_alive({root})",
            "assert not stray, (",
            "    f\"{len(stray)} node(s) that left the tree are still alive, freed only by the cyclic collector: \"",
            "    f\"{stray[0]}\"",
            ")",
        ]
    lines += ["print('OK: the property holds')"]
    return lines


def _attribute_expr(recorder: Recorder, value: Any) -> str:
    """An expression for a tensor one of the recorded objects holds as an attribute."""
    named = recorder.name_of(value)
    if named is not None:
        return named
    for expr, obj in recorder.objects():
        for name, attr in list(attributes_of(obj).items()):
            if attr is value:
                return f"{expr}.{name}"
    raise ScriptError("a free list the check compares with is not an attribute of an object the script builds")


def _document(trace: Trace, signature: Signature, recorder: Recorder, body: List[str], finding: Optional[KnownFinding]) -> str:
    expected = finding.summary if finding else "the property below holds (the harness's contract for the cache)"
    header = [
        '"""Reproducer for SGLang ' + trace.impl_version + f" ({trace.impl}): {signature.key}",
        "",
        f"Found by the hybrid radix cache harness{f' (known finding {finding.name})' if finding else ''}; this file",
        "imports only SGLang, torch and the standard library. It builds the pools and the cache as the",
        "harness's adapter builds them and makes the same calls the scheduler made.",
        "",
        "What goes wrong: " + expected,
        "Expected: " + ("the last call returns." if signature.kind == EXCEPTION else f"{signature.check} holds at the end."),
        f"Happens on {trace.impl_version}: " + ("it raises." if signature.kind == EXCEPTION else "the assertion at the end fails."),
        "A fixed release prints 'OK'.",
        '"""',
    ]
    imports = [f"from {module} import {', '.join(sorted(names))}" for module, names in sorted(recorder.imports.items())]
    imports += [f"import {module} as {alias}" for module, alias in sorted(recorder.module_aliases.items())]
    stand_ins = [inspect.getsource(cls) for cls in recorder.stand_ins]
    tracking = []
    if signature.check == "node_reclaimed":
        tracking = ["", "seen = weakref.WeakSet()  # every node the tree held at the end of a step"]
        body = [line if not line.startswith("# end of step") else f"{line}\nseen.update(tree_nodes({_root_expr(recorder)}))" for line in body]
    core = trace.impl.removeprefix("sglang-") if trace.impl in ("sglang-python", "sglang-rust") else None
    sections = [
        "\n".join(header),
        PRELUDE.strip("\n")
        + (f'\nos.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = {core!r}  # the tree core it was found on' if core else ""),
        "\n".join(imports),
        "\n\n".join(s.rstrip() for s in stand_ins),
        NODE_HELPERS.strip("\n") if signature.kind == INVARIANT else "",
        "gc.disable()  # reference counting alone, as the harness checks it" + "\n".join(tracking),
        "\n".join(body),
    ]
    return "\n\n\n".join(s for s in sections if s) + "\n"


def _root_expr(recorder: Recorder) -> str:
    for expr, obj in recorder.objects():
        if type(obj).__name__ in ("MambaRadixCache", "UnifiedRadixCache"):
            return f"{expr}.root_node" if hasattr(obj, "root_node") else f"{expr}.tree_core.root_node"
    raise ScriptError("no cache among the objects the script builds")
