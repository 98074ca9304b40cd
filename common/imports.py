"""Import paths a run config names, resolved only inside the packages a site permits.

The run config names code by import path: a user's model (`model = "package.module:factory"`) and a plugin
algorithm (`algorithm = "package.module:Name"`, whose row names its strategy and client rule the same way). The
run config is written by whoever submits the run, while the import runs on the server and on every SuperNode, so
a path alone must not make a site run a module's code: `algorithm = "antigravity:X"` would otherwise open a
browser on every host before any check could refuse it. `import_attribute` is the one resolver for such paths,
and it refuses a path outside the site's permitted packages before importing anything:

- fedsynth's own packages (`BUILTIN_PACKAGES`), which hold every built-in row and model;
- the run's own Flower app: a top-level package that Python would load from a Flower app directory on
  `sys.path` (a folder whose `pyproject.toml` declares `[tool.flwr.app.components]`). Flower puts the app it
  installed from the FAB there before it loads the ServerApp or ClientApp, and `flwr run .` runs from it, so a
  package shipped inside the app (docs/own-data.md) is permitted with no setting. The check asks Python's
  finders where the package lies (`importlib.util.find_spec` of the top-level name runs none of its code);
- the packages the site lists (`SiteImports.listed`): on a SuperNode the node config key `allowed-imports`,
  and on every host the environment variable `FEDSYNTH_ALLOWED_IMPORTS` of the process (the only setting of the
  ServerApp's host: the run config is the submitter's, so it cannot be the server's choice). An entry permits
  itself and its submodules (`mylab` permits `mylab.models`; `mylab.models` does not permit `mylab.other`).

Which site is asking is a context variable, not a parameter: the paths are resolved deep inside the run
config's parts (`parse_run_config`, `make_model`, the client registry), and the site is the same for all of
them while one message (a node) or one run (the ServerApp) is handled. `site_imports` sets it around that
work; outside it, the process's own setting applies under the name "this host".

A module that raises while it is imported, `SystemExit` and `KeyboardInterrupt` included, is a ConfigError
naming the path: a permitted package is trusted to run, not to end the node's process.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.errors import ConfigError

BUILTIN_PACKAGES = ("common", "client_app", "server_app", "fedsynth")
NODE_KEY = "allowed-imports"  # the node config key
ENV_VAR = "FEDSYNTH_ALLOWED_IMPORTS"  # the process's setting (the ServerApp's host: the only one)
# a listed package: dotted Python identifiers, nothing else (no paths, no wildcards)
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_ENTRIES = 256
_MAX_TEXT = 16384


@dataclass(frozen=True)
class SiteImports:
    """Who resolves import paths (`site`, for the messages) and the packages it lists beyond the defaults."""

    site: str
    listed: tuple[str, ...] = ()


def parse_listed(text: Any, source: str) -> tuple[str, ...]:
    """The packages a setting lists (separated by spaces or commas); ConfigError naming `source` when malformed."""
    if not isinstance(text, str):
        raise ConfigError(f"{source} = {text!r} must be text: package names separated by spaces or commas")
    if len(text) > _MAX_TEXT:
        raise ConfigError(f"{source} is {len(text)} characters long; at most {_MAX_TEXT}")
    entries = tuple(entry for entry in re.split(r"[\s,]+", text) if entry)
    if len(entries) > _MAX_ENTRIES:
        raise ConfigError(f"{source} lists {len(entries)} packages; at most {_MAX_ENTRIES}")
    for entry in entries:
        if not _PACKAGE.fullmatch(entry):
            raise ConfigError(f"{source}: {entry!r} is not a package name (dotted Python identifiers, e.g. "
                              "mylab or mylab.models)")
    return entries


def host_listed(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The packages this process's environment lists (`FEDSYNTH_ALLOWED_IMPORTS`)."""
    environ = os.environ if environ is None else environ
    return parse_listed(environ.get(ENV_VAR, ""), f"environment variable {ENV_VAR}")


def node_imports(node_id: int, node_config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> SiteImports:
    """A SuperNode's setting: node config `allowed-imports` and its host's `FEDSYNTH_ALLOWED_IMPORTS`."""
    name = node_config.get("name")
    site = f"node {node_id}" + (f" ({name})" if isinstance(name, str) and name else "")
    listed = parse_listed(node_config.get(NODE_KEY, ""), f"{site}: node config key '{NODE_KEY}'")
    return SiteImports(site, listed + host_listed(environ))


def server_imports(environ: Mapping[str, str] | None = None) -> SiteImports:
    """The ServerApp host's setting: its process's `FEDSYNTH_ALLOWED_IMPORTS`."""
    return SiteImports("the ServerApp", host_listed(environ))


_CURRENT: ContextVar[SiteImports | None] = ContextVar("fedsynth_site_imports", default=None)


@contextmanager
def site_imports(site: SiteImports) -> Iterator[None]:
    """Resolve every import path inside this block as `site` permits."""
    token = _CURRENT.set(site)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_site() -> SiteImports:
    """The site resolving paths now: the one `site_imports` set, else this process under its own setting."""
    return _CURRENT.get() or SiteImports("this host", host_listed())


@lru_cache(maxsize=64)
def is_flower_app_dir(folder: str) -> bool:
    """Whether `folder` holds a Flower app: a pyproject.toml declaring `[tool.flwr.app.components]`."""
    path = Path(folder) / "pyproject.toml"
    try:
        if not path.is_file() or path.stat().st_size > 1_000_000:
            return False
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    components = config.get("tool", {}).get("flwr", {}).get("app", {}).get("components")
    return isinstance(components, dict) and bool(components)


def app_package_dir(top: str) -> Path | None:
    """The Flower app directory Python would load the top-level package `top` from, or None (no code runs)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        origin = Path(spec.origin)
        folder = origin.parent.parent if origin.name.startswith("__init__.") else origin.parent
    elif spec.submodule_search_locations:  # a namespace package
        folder = Path(next(iter(spec.submodule_search_locations))).parent
    else:
        return None
    folder = folder.resolve()
    return folder if is_flower_app_dir(str(folder)) else None


def permitted(module_name: str, site: SiteImports) -> bool:
    """Whether `site` permits importing `module_name` (its own packages, the run's app, or a listed package)."""
    top = module_name.split(".")[0]
    if top in BUILTIN_PACKAGES:
        return True
    if any(module_name == entry or module_name.startswith(entry + ".") for entry in site.listed):
        return True
    return app_package_dir(top) is not None


def refusal(module_name: str, what: str, site: SiteImports) -> str:
    """Why `site` refuses the module: what names it, the defaults, the site's list and how to extend it."""
    listed = ", ".join(site.listed) or "none"
    return (f"{site.site}: {what}: package {module_name.split('.')[0]!r} is not one this site permits to import, "
            f"so it was not imported. Permitted: fedsynth's own ({', '.join(BUILTIN_PACKAGES)}), packages inside "
            f"the run's Flower app, and those listed ({listed}); a site adds one with the node config key "
            f"'{NODE_KEY}' or the environment variable {ENV_VAR} (docs/own-data.md, \"Which packages a site "
            "imports\")")


def import_attribute(path: str, what: str, kind: str = "attribute") -> Any:
    """The object `"package.module:attribute"` names (a user's model factory, a plugin algorithm and its halves);
    ConfigError starting with `what` and saying what failed (`kind`: what the attribute must be, in the message).

    A path outside the packages the current site permits is refused before its module is imported."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise ConfigError(f"{what}: {path!r} is not an import path; write it as package.module:attribute")
    if not _PACKAGE.fullmatch(module_name) or not attribute.isidentifier():
        raise ConfigError(f"{what}: {path!r} is not an import path; package.module:attribute takes dotted "
                          "Python identifiers (no relative or file paths)")
    site = current_site()
    if not permitted(module_name, site):
        raise ConfigError(refusal(module_name, what, site))
    try:
        module = importlib.import_module(module_name)
    except BaseException as err:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from a module's code included
        raise ConfigError(
            f"{site.site}: {what}: cannot import module {module_name!r} ({type(err).__name__}: {err}); it must be importable "
            "on the server and on every SuperNode (inside the Flower app that `flwr run` ships, or installed on "
            "every host)") from None
    if not hasattr(module, attribute):
        raise ConfigError(f"{what}: module {module_name!r} has no {kind} {attribute!r}")
    return getattr(module, attribute)
