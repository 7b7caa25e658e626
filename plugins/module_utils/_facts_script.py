# Copyright (c) vllm_ops.dflash contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The probe script of vllm_facts (_facts), run in the release venv's own python, never imported there.

It finds the `vllm` package without executing `vllm/__init__.py`, reads the distribution metadata, imports
torch, then loads each compiled extension by file path and streams one sentinel-prefixed event per result.
Standard library only.
"""

__all__ = ["PROBE_SCRIPT"]

# Runs in the release venv with `python -I` (no cwd, no PYTHON* variables on sys.path): Python 3.8+,
# standard library only. Keep it free of newer syntax; a unit test parses it with feature_version 3.8.
PROBE_SCRIPT = r'''
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys

MARK = "@@vllm_facts@@"  # replaced by the per-run mark given in argv (extension output cannot forge it)


def emit(event, **data):
    data["event"] = event
    # The leading newline keeps the mark at the start of a line even after unterminated extension output.
    sys.stdout.write("\n" + MARK + " " + json.dumps(data) + "\n")
    sys.stdout.flush()


def error_text(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def metadata_of(name):
    try:
        from importlib import metadata
        dist = metadata.distribution(name)
    except Exception as exc:
        return {"error": error_text(exc)}
    info = {"version": dist.version, "direct_url": None}
    try:
        text = dist.read_text("direct_url.json")
        info["direct_url"] = json.loads(text) if text else None
    except Exception as exc:
        info["direct_url_error"] = error_text(exc)
    return info


def extension_files(package_dir):
    """(module, path, importable suffix?) for every .so, the one `import` would pick per module name."""
    suffixes = list(importlib.machinery.EXTENSION_SUFFIXES)
    chosen = {}
    parent = os.path.dirname(package_dir)
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            if not filename.endswith(".so"):
                continue
            stem = filename.split(".", 1)[0]
            suffix = filename[len(stem):]
            rank = suffixes.index(suffix) if suffix in suffixes else len(suffixes)
            relative = os.path.relpath(os.path.join(dirpath, stem), parent)
            module = ".".join(relative.split(os.sep))
            path = os.path.join(dirpath, filename)
            if module not in chosen or rank < chosen[module][0]:
                chosen[module] = (rank, path, suffix)
    found = []
    for module in sorted(chosen):
        rank, path, suffix = chosen[module]
        found.append({"module": module, "path": path, "suffix_ok": rank < len(suffixes), "suffix": suffix})
    return found, suffixes


def load(module, path):
    spec = importlib.util.spec_from_file_location(module, path)
    if spec is None or spec.loader is None:
        raise ImportError("no loader for " + path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)


def cpu_features(torch_module, features):
    """name -> bool, from torch.cpu as vLLM asks it, else from /proc/cpuinfo's flags (no torch)."""
    flags = None
    found = {}
    for name, (function, flag) in sorted(features.items()):
        check = getattr(getattr(torch_module, "cpu", None), function, None)
        if check is not None:
            try:
                found[name] = bool(check())
                continue
            except Exception:
                pass
        if flags is None:
            flags = set()
            try:
                with open("/proc/cpuinfo") as handle:
                    for line in handle:
                        if line.startswith("flags"):
                            flags.update(line.split(":", 1)[1].split())
                            break
            except OSError:
                pass
        found[name] = flag in flags
    return found


def choose_cpu_variant(extensions, rule, torch_module):
    """The CPU build's copy of vllm._C that vLLM loads here, or None for a build with one vllm._C."""
    if not rule:
        return None
    by_module = dict((item["module"], item) for item in extensions)
    family = [module for module, needs in rule["variants"]]
    if not any(module in by_module for module in family if module != rule["loads_as"]):
        return None
    features = cpu_features(torch_module, rule["features"])
    wanted = None
    for module, needs in rule["variants"]:
        if all(features.get(need) for need in needs):
            wanted = module
            break
    item = by_module.get(wanted)
    not_loaded = dict((m, by_module[m]["path"]) for m in family if m in by_module and m != wanted)
    return {"module": wanted, "path": item["path"] if item else None, "features": features,
            "not_loaded": not_loaded, "family": family}


def main():
    global MARK
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    MARK = options.get("mark", MARK)
    skip = set(options.get("skip", []))
    env = {"python_version": platform.python_version(), "executable": sys.executable, "package_dir": None}
    try:
        spec = importlib.util.find_spec("vllm")  # a top-level find_spec executes nothing of the package
    except Exception as exc:
        spec = None
        env["find_spec_error"] = error_text(exc)
    if spec is None or spec.submodule_search_locations is None:
        env["not_a_package"] = spec is not None
        emit("env", **env)
        emit("done")
        return
    package_dir = os.path.realpath(list(spec.submodule_search_locations)[0])
    env["package_dir"] = package_dir
    env["metadata"] = metadata_of(options.get("distribution") or "vllm")
    env["extensions"], env["extension_suffixes"] = extension_files(package_dir)
    emit("env", **env)

    torch_module = None
    if options.get("torch", True):
        if importlib.util.find_spec("torch") is None:
            emit("torch", present=False)
        else:
            emit("loading", module="torch", path=None)
            try:
                import torch
                torch_module = torch
                emit("torch", present=True, version=str(torch.__version__), cuda=torch.version.cuda)
            except BaseException as exc:
                emit("torch", present=True, error=error_text(exc))

    rule = options.get("cpu_variants")
    variant = choose_cpu_variant(env["extensions"], rule, torch_module)
    if variant is not None:
        emit("cpu_variant", module=variant["module"], path=variant["path"], features=variant["features"],
             not_loaded=variant["not_loaded"])
        if variant["path"] is None:
            emit("extension", module=rule["loads_as"], path=None, ok=False,
                 error="vLLM loads %s on this CPU (%s) and this build lacks it" % (variant["module"], ", ".join(
                     "%s=%s" % (k, "yes" if v else "no") for k, v in sorted(variant["features"].items()))))
    for item in env["extensions"]:
        if item["path"] in skip:
            continue
        if variant is not None and item["module"] in variant["family"]:
            if item["path"] != variant["path"]:
                continue  # not the copy vLLM loads on this CPU
            item = dict(item, module=rule["loads_as"])  # each copy defines PyInit__C: loaded as vLLM has it
        if not item["suffix_ok"]:
            message = "%s cannot be imported by Python %s: suffix %s is not one of %s" % (
                item["path"], env["python_version"], item["suffix"], ", ".join(env["extension_suffixes"]))
            emit("extension", module=item["module"], path=item["path"], ok=False, error=message)
            continue
        emit("loading", module=item["module"], path=item["path"])
        try:
            load(item["module"], item["path"])
            emit("extension", module=item["module"], path=item["path"], ok=True, error=None)
        except BaseException as exc:
            emit("extension", module=item["module"], path=item["path"], ok=False, error=error_text(exc))
    emit("done")


main()
'''
