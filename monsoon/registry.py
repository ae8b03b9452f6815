"""One registry per kind of component, open to other packages.

monsoon's own strategies, rules, engines, problems and compressors are
registered by name in their folders. Another package adds its own through
a Python entry point, the convention pytest and others use, in its
``pyproject.toml``::

    [project.entry-points."monsoon.strategies"]
    ssp = "my_package.ssp:StaleSynchronous"

The groups are ``monsoon.strategies``, ``monsoon.rules``,
``monsoon.engines``, ``monsoon.problems`` and ``monsoon.compressors``.
Entry points are read the first time a registry is asked for its names,
and again after ``reload()``. A built-in name cannot be replaced (a
plug-in that has one is skipped with a warning); a plug-in that fails to
import, or names something other than its kind's class (a ``Strategy``
subclass, a ``ProblemSpec``...), is reported in one line when it is asked
for, by name and entry point, and the other commands run. A problem is
known by its entry point's name, whatever its spec's ``name``.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from importlib.metadata import entry_points

from .errors import ConfigError
from .options import Option, declared


class Registry:
    def __init__(self, kind: str, group: str, builtins: dict, base: type | None = None,
                 instances: bool = False):
        self.kind = kind            # "strategy", "rule", "engine", "problem", "compressor"
        self.group = group
        self._builtins = dict(builtins)
        # what a plug-in's entry point must name: a subclass of ``base``, or
        # with ``instances`` an instance of it (a ProblemSpec)
        self._base, self._instances = base, instances
        self._plugins: dict | None = None
        self._broken: dict[str, str] = {}

    @property
    def builtins(self) -> tuple[str, ...]:
        """monsoon's own components' names, in their order."""
        return tuple(self._builtins)

    @property
    def flag(self) -> str:
        return f"--{self.kind}"

    def reload(self) -> None:
        """Read the entry points again (after installing a plug-in)."""
        self._plugins = None

    def _load(self) -> dict:
        if self._plugins is None:
            self._plugins, self._broken = {}, {}
            for ep in entry_points(group=self.group):
                if ep.name in self._builtins:
                    print(f"monsoon: warning: the {self.kind} plug-in {ep.name!r} ({ep.value}) "
                          f"is not used: {ep.name} is monsoon's own {self.kind}, which a "
                          "plug-in cannot replace; register it under another name",
                          file=sys.stderr)
                    continue
                if ep.name in self._plugins:
                    continue
                try:
                    component = ep.load()
                except Exception as exc:  # noqa: BLE001 - named when asked for
                    self._broken[ep.name] = (
                        f"the {self.kind} plug-in {ep.name!r} ({ep.value}) "
                        f"{_load_failure(ep, exc)}")
                    continue
                misfit = self._misfit(component)
                if misfit is not None:
                    self._broken[ep.name] = (
                        f"the {self.kind} plug-in {ep.name!r} ({ep.value}) is {misfit}: fix "
                        "its entry point in the package that provides it (docs/extending.md)")
                    continue
                if self._instances and getattr(component, "name", None) != ep.name:
                    component = dataclasses.replace(component, name=ep.name)
                if getattr(component, "name", None) in (None, "strategy", "rule", "engine"):
                    try:
                        component.name = ep.name
                    except (AttributeError, TypeError):
                        pass
                self._plugins[ep.name] = component
        return {**self._builtins, **self._plugins}

    def _misfit(self, component) -> str | None:
        """What ``component`` is, where it is not what this registry holds."""
        if self._base is None:
            return None
        if self._instances:
            if isinstance(component, self._base):
                return None
            want = f"a {self.group}.{self._base.__name__}"
        else:
            if isinstance(component, type) and issubclass(component, self._base):
                return None
            want = f"a subclass of {self.group}.{self._base.__name__}"
        got = f"the class {component.__name__}" if isinstance(component, type) else \
            f"a {type(component).__name__}"
        return f"{got}, not {want}"

    def all(self) -> dict:
        return self._load()

    def names(self) -> list[str]:
        return list(self._load())

    def broken(self, name: str) -> bool:
        self._load()
        return name in self._broken

    def __contains__(self, name) -> bool:
        return name in self._load()

    def get(self, name: str):
        components = self._load()
        if name in components:
            return components[name]
        if name in self._broken:
            raise ConfigError(self._broken[name])
        raise ConfigError(f"unknown {self.kind} {name!r}; choose one of: "
                          f"{', '.join(self.names())}")

    def takers(self, option: str) -> list[str]:
        """Names of the components that declare ``option``."""
        return [n for n, c in self._load().items() if any(o.name == option for o in declared(c))]

    def options(self) -> dict[str, Option]:
        """Every option a component of this kind declares, by name."""
        found: dict[str, Option] = {}
        for component in self._load().values():
            for o in declared(component):
                if found.setdefault(o.name, o) is not o and not _same(found[o.name], o):
                    print(f"monsoon: warning: {self.kind} options named {o.name!r} differ; "
                          f"the first one declared is used", file=sys.stderr)
        return found


def _same(a: Option, b: Option) -> bool:
    return (a.cli, a.type, a.default) == (b.cli, b.type, b.default)


def _load_failure(ep, exc: Exception) -> str:
    """Why entry point ``ep`` failed to load with ``exc``, and what to
    change: a typo in the entry point's module or attribute (dotted or
    not) is fixed there; a module the plug-in imports that is not installed
    is to install; any other error raised while the plug-in's module
    imports is fixed in the plug-in's package."""
    module, attr = ep.module, ep.attr or ""
    missing = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and missing and \
            (module == missing or module.startswith(missing + ".")):
        return (f"names the module {module!r}, which is not installed: fix the module in "
                "its entry point, or install the package that provides it")
    if isinstance(exc, AttributeError) and attr and module in sys.modules and \
            _undefined(sys.modules[module], attr):
        return (f"names {attr!r}, which the module {module!r} does not define: fix the "
                "name in its entry point")
    if isinstance(exc, ModuleNotFoundError) and missing:
        return (f"needs the module {missing!r}, which is not installed: install it "
                f"(the plug-in's module {module!r} imports it)")
    return (f"could not be loaded: importing {module!r} raised {type(exc).__name__}: {exc}; "
            "fix it in the package that provides the plug-in")


def _undefined(obj, attr: str) -> bool:
    """Whether the dotted name ``attr`` is missing from ``obj`` (the
    module imported whole, so the entry point's name is at fault)."""
    for part in attr.split("."):
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            return True
    return False
