"""Code run once another module's own import has finished, without importing that module: the
hooks convnn keeps on optional or heavy modules (timm's model registry, Inductor's lowerings) cost
nothing in a program that never imports them. (Python has no post-import hook of its own; a finder
at the head of sys.meta_path that wraps the module's loader is the standard way to get one.)"""
import importlib.abc
import importlib.util
import sys


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` through the other finders (once: it removes itself first) and runs
    callback(module) after the module has executed."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.callback(module)

        spec.loader.exec_module = exec_module
        return spec


def call_after_import(name, callback):
    """callback(module) now if module `name` is imported already, otherwise right after its first
    import; never where it is not installed. One hook per (name, callback)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    top_level = name.partition(".")[0]
    if importlib.util.find_spec(top_level) is None:
        return
    if not any(isinstance(finder, _AfterImport) and (finder.name, finder.callback) == (name, callback)
               for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
