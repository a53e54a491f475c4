"""Recording the calls an adapter makes into SGLang, as Python statements.

While a `Recorder` is installed, every SGLang class, function and module the adapter reaches
through `load_sglang()`'s namespace is wrapped, and so are the methods and attribute writes of
every SGLang object the adapter builds or is handed (and of the stand-ins the adapter passes
SGLang in place of its scheduler's objects: `STAND_INS`). A call the adapter makes (not one
SGLang makes inside another) becomes one statement: `v3 = cache.match_prefix(key=v2)`. Values
are named by identity (an object SGLang returned, or a harness tensor passed once), else written
as literals; one that can be neither is a `ScriptError`.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import types
import weakref
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch


class ScriptError(Exception):
    """The run cannot be written as a standalone script; the message says why."""


@dataclass
class Statement:
    code: str
    raised: Optional[BaseException] = None  # the exception the call raised when recorded


@dataclass
class Recorder:
    """The statements, the names of the values they made, and what to import for them."""

    statements: List[Statement] = field(default_factory=list)
    imports: Dict[str, Set[str]] = field(default_factory=dict)  # module -> names
    module_aliases: Dict[str, str] = field(default_factory=dict)  # module -> alias
    stand_ins: List[type] = field(default_factory=list)  # classes whose source the script holds
    depth: int = 0  # > 0: inside SGLang (or a paused stretch): nothing is recorded
    _names: Dict[int, Tuple[str, Any]] = field(default_factory=dict)  # id -> (expression, ref)
    _count: int = 0
    _patched: List[Tuple[type, str, Any]] = field(default_factory=list)
    _wrapped: List[type] = field(default_factory=list)  # classes whose methods are recorded
    # request records (stand-ins, SGLang's `Req` and `ReqKvInfo`): expression, and the state of
    # their attributes last written down; what the adapter changes in them (an `append` too) is
    # written as assignments before its next call
    _records: Dict[int, Tuple[Any, str, Dict[str, Any]]] = field(default_factory=dict)

    # ----- names ------------------------------------------------------------------------------

    def fresh(self, prefix: str = "v") -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def register(self, value: Any, expr: str, depth: int = 1) -> None:
        """Name `value` (and, one level down, the objects its attributes hold)."""
        if _literal_type(value) or isinstance(value, (types.ModuleType, type)) or callable(value) and not _is_object(value):
            return
        if id(value) in self._names:
            return
        if isinstance(value, tuple):  # a result record: its fields are what later calls pass
            fields = getattr(value, "_fields", ())
            for name in fields:
                self.register(getattr(value, name), f"{expr}.{name}", depth)
            return
        try:
            ref: Any = weakref.ref(value, lambda _, key=id(value): self._names.pop(key, None))
        except TypeError:
            ref = value  # kept alive: its id must not be reused while it has a name
        self._names[id(value)] = (expr, ref)
        if type(value) in self.stand_ins or type(value).__name__ in RECORD_CLASSES:
            self._records[id(value)] = (ref, expr, _state(value))
        self._wrap_class(type(value))
        if depth > 0 and not isinstance(value, torch.Tensor):
            for name, attr in list(attributes_of(value).items()):
                if not name.startswith("_"):
                    self.register(attr, f"{expr}.{name}", depth - 1)

    def objects(self) -> Iterator[Tuple[str, Any]]:
        """Every named object still alive, with its expression."""
        for expr, ref in list(self._names.values()):
            obj = _alive(ref)
            if obj is not None:
                yield expr, obj

    def name_of(self, value: Any) -> Optional[str]:
        entry = self._names.get(id(value))
        if entry is None:
            return None
        expr, ref = entry
        return expr if _alive(ref) is value else None

    def expr(self, value: Any, contents: bool = False) -> str:
        """`value` as an expression of the script (with `contents`, a list or dict by its items,
        not by the name of the one it is)."""
        named = None if contents and isinstance(value, (list, dict)) else self.name_of(value)
        if named is not None:
            return named
        if isinstance(value, enum.Enum):  # before int: an IntEnum is one
            return f"{self.import_of(type(value))}.{value.name}"
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        if isinstance(value, (list, tuple)):
            items = ", ".join(self.expr(v) for v in value)
            return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{self.expr(k)}: {self.expr(v)}" for k, v in value.items()) + "}"
        if isinstance(value, slice):
            return f"slice({self.expr(value.start)}, {self.expr(value.stop)}, {self.expr(value.step)})"
        if isinstance(value, torch.dtype):
            return str(value)
        if isinstance(value, torch.device):
            return "torch.device(DEVICE)"
        if isinstance(value, array):
            self.need("array", "array")
            return f"array({value.typecode!r}, {value.tolist()!r})"
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, type) or inspect.isfunction(value) or inspect.isbuiltin(value):
            return self.import_of(value)
        if isinstance(value, types.ModuleType):
            return self.module_alias(value.__name__)
        raise ScriptError(f"the adapter passed SGLang a {type(value).__module__}.{type(value).__qualname__} the script cannot name")

    def _tensor(self, value: torch.Tensor) -> str:
        """A harness tensor, passed for the first time: a variable of its own (SGLang may keep it)."""
        data = value.detach().cpu()
        literal = (f"torch.empty({tuple(data.shape)}, dtype={data.dtype}, device=DEVICE)" if data.numel() == 0
                   else f"torch.tensor({data.tolist()!r}, dtype={data.dtype}, device=DEVICE)")
        name = self.fresh("t")
        self.emit(f"{name} = {literal}")
        self.register(value, name)
        return name

    def need(self, module: str, name: str) -> None:
        self.imports.setdefault(module, set()).add(name)

    def import_of(self, obj: Any) -> str:
        module, qualname = obj.__module__, obj.__qualname__
        if any(cls is obj for cls in self.stand_ins):
            return qualname
        top = qualname.split(".")[0]
        self.need(module, top)
        return qualname

    def module_alias(self, module: str) -> str:
        if module not in self.module_aliases:
            self.module_aliases[module] = module.rsplit(".", 1)[-1] + "_module"
        return self.module_aliases[module]

    # ----- statements -------------------------------------------------------------------------

    def emit(self, code: str, raised: Optional[BaseException] = None) -> None:
        self.statements.append(Statement(code, raised))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing in the block is recorded (the harness's own checks read the cache)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def arguments(self, args: tuple, kwargs: dict) -> str:
        return ", ".join([self.expr(a) for a in args] + [f"{k}={self.expr(v)}" for k, v in kwargs.items()])

    def call(self, target: str, fn: Callable, args: tuple, kwargs: dict, result_prefix: str = "v") -> Any:
        """Run `fn(*args, **kwargs)`, recording it as `target(...)` when the adapter made it."""
        if self.depth > 0:
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
        self.sync_records()
        code = f"{target}({self.arguments(args, kwargs)})"
        self.depth += 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self.emit(code, raised=exc)
            raise
        finally:
            self.depth -= 1
            self.sync_records(write=False)  # what SGLang changed, it changes in the script too
        if _literal_type(result) or result is None:
            self.emit(code)
        else:
            name = self.name_of(result) or self.fresh(result_prefix)
            self.emit(f"{name} = {code}")
            self.register(result, name)
        return result

    def overwritten(self, tensor: torch.Tensor) -> None:
        """The harness fills a tensor it handed SGLang (or a row of SGLang's) with -1: the
        scheduler reusing its buffers. A tensor the script never named is not SGLang's concern."""
        if self.depth > 0:
            return
        named = self.name_of(tensor)
        base = tensor._base if tensor._base is not None else None
        if named is None and base is not None and self.name_of(base) is not None:
            named = f"{self.name_of(base)}.as_strided({tuple(tensor.size())}, {tuple(tensor.stride())}, {tensor.storage_offset()})"
        if named is not None:
            self.emit(f"{named}.fill_(-1)")

    def sync_records(self, write: bool = True) -> None:
        """Write down (or, with `write=False`, only note) what changed in the request records."""
        for key, (ref, expr, last) in list(self._records.items()):
            obj = _alive(ref)
            if obj is None:
                del self._records[key]
                continue
            now = _state(obj)
            if write:
                for name, value in attributes_of(obj).items():
                    if name in now and now[name] != last.get(name, _ABSENT):
                        self.emit(f"{expr}.{name} = {self.expr(value, contents=True)}")
                        self.register(value, f"{expr}.{name}", depth=0)
            self._records[key] = (ref, expr, now)

    # ----- wrapping ---------------------------------------------------------------------------

    def wrap_namespace(self, sgl: types.SimpleNamespace) -> Callable[[], None]:
        """Record what the adapter does with the namespace's SGLang classes (construction, static
        and class methods, then the methods of what they build), functions and modules; returns
        the undo of the namespace (`undo` restores the classes)."""
        saved = dict(vars(sgl))
        for name, value in saved.items():
            if isinstance(value, types.ModuleType) and _from_sglang(value.__name__):
                setattr(sgl, name, _RecordedModule(self, value))
            elif isinstance(value, type) and _from_sglang(value.__module__) and not issubclass(value, enum.Enum):
                if inspect.isfunction(value.__init__):
                    self._record_construction(value)
                else:  # built without a Python __init__ (a msgspec Struct): its name in the namespace records it
                    setattr(sgl, name, self._recording(self.import_of(value), value))
            elif inspect.isfunction(value) and _from_sglang(value.__module__):
                setattr(sgl, name, self._recording(self.import_of(value), value))

        def undo() -> None:
            for name, value in saved.items():
                setattr(sgl, name, value)

        return undo

    def _recording(self, target: str, fn: Callable) -> Callable:
        """`fn`, its calls recorded as `target(...)` (its signature kept for `inspect`)."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(target, fn, args, kwargs)

        return call

    def _record_construction(self, cls: type) -> None:
        """The adapter's `cls(...)` and `cls.static_or_class_method(...)` become statements."""
        if any(patched is cls and name == "__init__" for patched, name, _ in self._patched):
            return
        original_init = cls.__init__
        recorder = self

        @functools.wraps(original_init)
        def init(obj: Any, *args: Any, **kwargs: Any) -> None:
            if recorder.depth > 0 or type(obj) is not cls:
                recorder.depth += 1
                try:
                    return original_init(obj, *args, **kwargs)
                finally:
                    recorder.depth -= 1
            recorder.sync_records()
            name = recorder.fresh("r" if cls in recorder.stand_ins else "v")
            code = f"{name} = {recorder.import_of(cls)}({recorder.arguments(args, kwargs)})"
            recorder.depth += 1
            try:
                original_init(obj, *args, **kwargs)
            finally:
                recorder.depth -= 1
            recorder.emit(code)
            recorder.register(obj, name, depth=0 if cls in recorder.stand_ins else 1)

        self._patch(cls, "__init__", init)
        for name, attr in list(vars(cls).items()):
            if name.startswith("_") or not isinstance(attr, (staticmethod, classmethod)):
                continue
            bound = getattr(cls, name)
            wrapped = self._recording(f"{self.import_of(cls)}.{name}", bound)
            self._patch(cls, name, staticmethod(wrapped))
        self._wrap_class(cls, force=cls in self.stand_ins)

    def wrap_stand_in(self, cls: type) -> None:
        """A harness class the adapter hands SGLang in place of its scheduler's: its source goes
        into the script, and its construction, methods and attribute writes are recorded."""
        if cls not in self.stand_ins:
            self.stand_ins.append(cls)
            self._record_construction(cls)

    def _wrap_class(self, cls: type, force: bool = False) -> None:
        """Record the adapter's calls of the class's methods and its attribute writes (once);
        `force`: a class not of SGLang's (a stand-in)."""
        if cls in self._wrapped or not (force or _from_sglang(cls.__module__)):
            return
        self._wrapped.append(cls)
        recorder = self
        for klass in cls.__mro__:
            if klass is object or not (_from_sglang(klass.__module__) or klass is cls):
                continue
            for name, attr in list(vars(klass).items()):
                if name.startswith("_") or not inspect.isfunction(attr) or hasattr(attr, "__recorded__"):
                    continue
                self._patch(klass, name, _method_wrapper(recorder, attr, name))
        original_setattr = cls.__setattr__

        def setattr_(obj: Any, name: str, value: Any) -> None:
            if recorder.depth == 0 and id(obj) not in recorder._records:  # a record's changes: `sync_records`
                target = recorder.name_of(obj)
                if target is not None:
                    recorder.emit(f"{target}.{name} = {recorder.expr(value)}")
                    original_setattr(obj, name, value)
                    recorder.register(value, f"{target}.{name}", depth=0)
                    return
            original_setattr(obj, name, value)

        try:
            self._patch(cls, "__setattr__", setattr_)
        except TypeError:  # a class of a compiled extension
            pass

    def _patch(self, cls: type, name: str, value: Any) -> None:
        original = cls.__dict__.get(name, _ABSENT)
        setattr(cls, name, value)
        self._patched.append((cls, name, original))

    def undo(self) -> None:
        for cls, name, original in reversed(self._patched):
            if original is _ABSENT:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._patched.clear()
        self._wrapped.clear()


_ABSENT = object()
RECORD_CLASSES = ("Req", "ReqKvInfo")  # SGLang's request records the adapter writes to


def attributes_of(obj: Any) -> Dict[str, Any]:
    """An object's attributes: its `__dict__`, its slots (a class with `__slots__`, a msgspec
    Struct's fields)."""
    found = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        names = klass.__dict__.get("__struct_fields__") or klass.__dict__.get("__slots__") or ()
        if not isinstance(names, (str, tuple, list)):
            continue
        for name in (names,) if isinstance(names, str) else names:
            if name not in found and name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found[name] = getattr(obj, name)
    return found


def _state(obj: Any) -> Dict[str, Any]:
    """An object's attributes as comparable values: literals as they are, containers by their
    items, any other object by identity."""
    return {name: _comparable(value) for name, value in attributes_of(obj).items() if not name.startswith("__")}


def _comparable(value: Any) -> Any:
    if _literal_type(value):
        return (type(value), value)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_comparable(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((_comparable(k), _comparable(v)) for k, v in value.items()))
    if isinstance(value, array):
        return (array, value.typecode, tuple(value))
    return (object, id(value))


def _method_wrapper(recorder: Recorder, fn: Callable, name: str) -> Callable:
    def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
        target = recorder.name_of(obj) if recorder.depth == 0 else None
        if target is None:
            recorder.depth += 1
            try:
                return fn(obj, *args, **kwargs)
            finally:
                recorder.depth -= 1
        return recorder.call(f"{target}.{name}", lambda *a, **k: fn(obj, *a, **k), args, kwargs)

    method.__wrapped__ = fn
    method.__recorded__ = True
    method.__signature__ = inspect.signature(fn)
    return method


class _RecordedModule:
    """An SGLang module in the namespace: its functions' calls and writes to it are recorded."""

    def __init__(self, recorder: Recorder, module: types.ModuleType):
        object.__setattr__(self, "_recorder", recorder)
        object.__setattr__(self, "_module", module)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if inspect.isfunction(value) and _from_sglang(value.__module__):
            return self._recorder._recording(f"{self._recorder.module_alias(self._module.__name__)}.{name}", value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        recorder = self._recorder
        if recorder.depth == 0:
            recorder.emit(f"{recorder.module_alias(self._module.__name__)}.{name} = {recorder.expr(value)}")
        setattr(self._module, name, value)


def _alive(ref: Any) -> Any:
    """What a name refers to: a weak reference's object (None once it died), or the object kept."""
    return ref() if isinstance(ref, weakref.ref) else ref


def _from_sglang(module: str) -> bool:
    return module == "sglang" or module.startswith("sglang.")


def _literal_type(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str, bytes)) or value is None


def _is_object(value: Any) -> bool:
    return not (inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value))
