"""What a found launch's MODEL word and the file's hardware hints stand for: the launch request's ``model`` object
(config.json and the small files beside it) and its ``hardware`` object.

The model is looked for where vLLM looks (vllm 0.33.0 transformers_utils/repo_utils.py:262-283
``file_or_path_exists``): a path that exists is the model, whatever it holds (:265-266); else the Hugging Face cache
through huggingface_hub's ``try_to_load_from_cache`` (:269-274); else the Hub (:279-281). Before those, the CLI's
``--models NAME=DIR`` map, which says where the checker can read a model the node has elsewhere.

Only small files are read, each bounded: config.json, quantization.txt, hf_quant_config.json,
preprocessor_config.json and model.safetensors.index.json's ``total_size``; never a weight.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping

from ..cli.check_files import read_json, read_model_dir, regular_file
from .found import FoundLaunch

MAX_REF = 4096  # PATH_MAX: a longer word is neither a path nor a repository id (at most 96 characters)
MAX_NAME = 512  # ModelSpec.name
MAX_REVISION = 256
HUB_TIMEOUT = 20.0  # seconds per file asked of the Hub, the whole answer included
# config.json, hf_quant_config.json, preprocessor_config.json from the Hub: the largest real ones are well under
# 1 MB (a classifier's id2label map); a "config.json" of several MB is not one, and is refused unread
HUB_SMALL_BYTES = 4 << 20
HUB_TAG_BYTES = 64 << 10  # quantization.txt (as the node agent reads it: service/agent/weights.py MAX_TAG)
NVIDIA_SMI_TIMEOUT = 10.0
NVIDIA_SMI_MAX_BYTES = 64 << 10  # a name, a size and a capability per GPU: a few kB for the largest node
# huggingface_hub's true values for its boolean switches (constants.py ENV_VARS_TRUE_VALUES)
TRUE = {"1", "ON", "YES", "TRUE"}
DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub constants.py:67 _HF_DEFAULT_ENDPOINT
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


class ResolveError(ValueError):
    """What could not be found. ``tried``: each place looked at, in order, with why it did not answer."""

    def __init__(self, what: str, tried: list[tuple[str, str]] | None = None):
        self.what, self.tried = what, list(tried or [])
        steps = "; ".join(f"({i}) {where}: {why}" for i, (where, why) in enumerate(self.tried, 1))
        super().__init__(f"{what}; tried, in order: {steps}" if steps else what)


def _show(ref: str) -> str:
    return repr(ref if len(ref) <= 120 else ref[:120] + "…")


# -- the model ---------------------------------------------------------------------------------------------------


MAX_URI = 2048  # ModelSpec.uri's bound


def resolve_model(
    ref: str,
    *,
    revision: str | None = None,
    models: Mapping[str, str | pathlib.Path] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict:
    """The launch request's ``model`` for the MODEL word ``ref`` of a launch (``{"name", "uri", "config",
    "quantization_txt"?, "hf_quant_config"?, "weights_bytes"?, "preprocessor_config"?}``): from ``models`` (the
    CLI's ``--models NAME=DIR``), a local directory, the Hugging Face cache, then the Hub, at ``revision``
    (``--revision``; default main) for the last two. ``env``: HF_HUB_CACHE, HF_HOME, HF_HUB_OFFLINE, HF_ENDPOINT,
    HF_TOKEN as the launch sees them (default: this process's). Raises ResolveError naming every place tried."""
    env = os.environ if env is None else env
    _check_ref(ref)
    if revision is not None:
        _check_revision(ref, revision)
    name = ref if len(ref) <= MAX_NAME else "…" + ref[-(MAX_NAME - 1) :]
    tried: list[tuple[str, str]] = []
    found = _from_models(ref, models, tried) or _from_path(ref, tried)
    if found is None:
        repo_id = _repo_id(ref, tried)
        found = _from_cache(repo_id, revision, env, tried) or _from_hub(repo_id, revision, env, tried)
    # uri: the MODEL word itself, which the rendered command loads (a request file naming the same uri signs the
    # same command)
    return {"name": name, **({"uri": ref} if len(ref) <= MAX_URI else {}), **found}


def _check_ref(ref: object) -> None:
    if not isinstance(ref, str) or not ref.strip():
        raise ResolveError("the model is empty: a launch's MODEL is a directory or a Hugging Face repository id")
    if len(ref) > MAX_REF:
        raise ResolveError(f"the model {_show(ref)} is {len(ref)} characters long: not a path or repository id")
    if CONTROL.search(ref):
        raise ResolveError(f"the model {_show(ref)} holds control characters: not a path or repository id")


def _check_revision(ref: str, revision: object) -> None:
    # a branch, tag or commit: it names a file under the cache's refs/ and a URL segment, so nothing that climbs
    if (
        not isinstance(revision, str)
        or len(revision) > MAX_REVISION
        or not REVISION.fullmatch(revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith("/")
    ):
        raise ResolveError(f"the revision {_show(str(revision))} of {_show(ref)} is not a branch, tag or commit name")


def _read_dir(d: pathlib.Path) -> dict:
    """config.json and the small files beside it (check_files.read_model_dir, each read bounded), and
    preprocessor_config.json; ValueError/OSError when one is unreadable."""
    out = read_model_dir(d)
    if not isinstance(out["config"], dict):
        raise ValueError(f"{d / 'config.json'} is not a JSON object")
    pre = d / "preprocessor_config.json"
    if regular_file(pre):
        out["preprocessor_config"] = read_json(pre)
    return out


def _read_dir_or_fail(d: pathlib.Path, where: str, ref: str, tried: list[tuple[str, str]]) -> dict:
    try:
        return _read_dir(d)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than the parser goes
        why = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:300]
        tried.append((where, why))
        raise ResolveError(f"cannot read the model {_show(ref)}", tried) from None


def _from_models(
    ref: str, models: Mapping[str, str | pathlib.Path] | None, tried: list[tuple[str, str]]
) -> dict | None:
    if not models:
        tried.append(("--models", "not given"))
        return None
    if ref not in models:
        tried.append(("--models", f"no NAME=DIR for {_show(ref)} (names: {', '.join(sorted(models))[:300]})"))
        return None
    d = pathlib.Path(models[ref])
    return _read_dir_or_fail(d, f"--models {ref}={d}", ref, tried)


def _from_path(ref: str, tried: list[tuple[str, str]]) -> dict | None:
    """A path that exists is the model, as vLLM takes it (repo_utils.py:265-266): nothing else is looked at."""
    p = pathlib.Path(ref)
    try:
        exists = p.exists()
    except OSError as exc:  # a component longer than NAME_MAX, a directory we may not enter
        tried.append(("local path", f"{_show(ref)}: {exc.strerror or exc.__class__.__name__}"))
        return None
    if not exists:
        tried.append(("local path", f"no such file or directory {_show(ref)} (from {os.getcwd()})"))
        return None
    if not p.is_dir():
        tried.append(("local path", f"{_show(ref)} is not a directory"))
        raise ResolveError(f"cannot read the model {_show(ref)}", tried)
    return _read_dir_or_fail(p, f"local directory {ref}", ref, tried)


def _repo_id(ref: str, tried: list[tuple[str, str]]) -> str:
    """``ref`` when it is a Hub repository id as huggingface_hub validates one (utils/_validators.py
    ``validate_repo_id``: ``name`` or ``namespace/name``, at most 96 characters, no ``--`` or ``..``)."""
    try:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id
    except ImportError as exc:  # a base install without its dependencies (pip --no-deps)
        tried.append(("Hugging Face cache and Hub", f"huggingface_hub is not installed ({exc})"))
        raise ResolveError(f"cannot find the model {_show(ref)}: pip install huggingface_hub", tried) from None
    try:
        validate_repo_id(ref)
    except HFValidationError:
        tried.append(("repository id", f"{_show(ref)} is not one (owner/name: letters, digits, '-', '_', '.')"))
        raise ResolveError(f"the model {_show(ref)} is neither a directory nor a Hugging Face repository id", tried)
    return ref


def _expand(value: str, env: Mapping[str, str]) -> str:
    """os.path.expandvars(os.path.expanduser(value)) over ``env`` instead of this process's environment."""
    if value == "~" or value.startswith("~/"):
        value = (env.get("HOME") or os.path.expanduser("~")) + value[1:]
    return re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), value)


def hub_cache_dir(env: Mapping[str, str]) -> pathlib.Path:
    """The Hugging Face cache as huggingface_hub finds it (2.4.0 constants.py:159-183): HF_HUB_CACHE, else the
    legacy HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub. An empty variable counts as unset."""
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache"), "huggingface"
    )
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(_expand(home, env), "hub")
    return pathlib.Path(_expand(hub, env))


def _from_cache(
    repo_id: str, revision: str | None, env: Mapping[str, str], tried: list[tuple[str, str]]
) -> dict | None:
    """The snapshot of ``revision`` (default main) in the Hugging Face cache, found by huggingface_hub's
    ``try_to_load_from_cache`` (file_download.py:1523-1614): ``models--ORG--NAME/refs/REV`` names a commit,
    ``snapshots/COMMIT/config.json`` is the file."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.file_download import repo_folder_name

    cache = hub_cache_dir(env)
    rev = revision or "main"
    where = f"Hugging Face cache {cache}"
    repo_dir = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    if not repo_dir.is_dir():
        tried.append((where, f"no {repo_dir.name}"))
        return None
    ref_file = repo_dir / "refs" / rev
    problem = _ref_file_problem(ref_file)
    if problem:
        tried.append((where, f"{repo_dir.name}/refs/{rev}: {problem}"))
        raise ResolveError(f"cannot read the model {_show(repo_id)}", tried)
    got = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache), revision=rev)
    if not isinstance(got, str):
        if got is not None:  # _CACHED_NO_EXIST: vLLM takes that as "no config.json" and stops (repo_utils.py:283)
            tried.append((where, f"{repo_dir.name} records that revision {rev} has no config.json (.no_exist)"))
            raise ResolveError(f"cannot find the model {_show(repo_id)}", tried)
        tried.append((where, f"{repo_dir.name} has no snapshot of revision {rev} holding config.json"))
        return None
    snapshot = pathlib.Path(got).parent
    return _read_dir_or_fail(snapshot, f"{where}: {repo_dir.name}/snapshots/{snapshot.name}", repo_id, tried)


def _ref_file_problem(ref_file: pathlib.Path) -> str | None:
    """What is wrong with a refs/ file huggingface_hub would read whole (it holds a 40-hex commit): a FIFO, a device
    or a large file would hang or fill the reader."""
    try:
        st = ref_file.stat()
    except FileNotFoundError:
        return None  # no such ref: try_to_load_from_cache takes the revision as a commit
    except OSError as exc:
        return exc.strerror or exc.__class__.__name__
    import stat

    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size > 1024:
        return f"{st.st_size} bytes: not a commit id"
    return None


def _offline(env: Mapping[str, str]) -> str | None:
    """The variable that puts huggingface_hub offline (constants.py:194: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if (env.get(var) or "").upper() in TRUE:
            return f"{var}={env[var]}"
    return None


def _from_hub(repo_id: str, revision: str | None, env: Mapping[str, str], tried: list[tuple[str, str]]) -> dict:
    """config.json from the Hub at ``revision``, then the small files at the commit its answer names (the branch
    may move meanwhile): service/tensor_readers.py's bounded HTTP reads through huggingface_hub's session."""
    from ..domain.tensors import MAX_INDEX_BYTES, TensorsError
    from ..tensor_readers import COMMIT, _checked_small, _Hub

    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    where = f"the Hub {endpoint}"
    offline = _offline(env)
    if offline:
        tried.append((where, f"not tried: offline ({offline})"))
        raise ResolveError(f"cannot find the model {_show(repo_id)}", tried)
    token: str | bool | None = (env["HF_TOKEN"] or False) if "HF_TOKEN" in env else None
    try:
        hub = _Hub(repo_id, revision, token, HUB_TIMEOUT, endpoint=endpoint)
        raw = hub.small("config.json", HUB_SMALL_BYTES)
        if raw is None:
            tried.append((where, f"HTTP 404: no config.json in {repo_id} at revision {revision or 'main'}"))
            raise ResolveError(f"cannot find the model {_show(repo_id)}", tried)
        if hub.commit is None and revision is not None and COMMIT.fullmatch(revision):
            hub.commit = revision
        hub.revision = hub.commit or revision  # every other file from the commit config.json came from
        out: dict = {"config": json.loads(_checked_small(repo_id, "config.json", raw))}
        for name, key, limit in (
            ("quantization.txt", "quantization_txt", HUB_TAG_BYTES),
            ("hf_quant_config.json", "hf_quant_config", HUB_SMALL_BYTES),
            ("preprocessor_config.json", "preprocessor_config", HUB_SMALL_BYTES),
        ):
            data = hub.small(name, limit)
            if data is not None:
                data = _checked_small(repo_id, name, data)
                out[key] = data.decode("utf-8") if name.endswith(".txt") else json.loads(data)
        index = hub.small("model.safetensors.index.json", MAX_INDEX_BYTES)
        if index is not None:
            total = json.loads(_checked_small(repo_id, "model.safetensors.index.json", index)).get("metadata") or {}
            if isinstance(total.get("total_size"), int):
                out["weights_bytes"] = total["total_size"]
    except TensorsError as exc:
        tried.append((where, exc.message))
        raise ResolveError(f"cannot read the model {_show(repo_id)}", tried) from None
    except (ValueError, RecursionError) as exc:
        tried.append((where, f"an answer is not what its file must be ({str(exc)[:200]})"))
        raise ResolveError(f"cannot read the model {_show(repo_id)}", tried) from None
    return out


# -- the hardware ------------------------------------------------------------------------------------------------

# what a launch of each kind would say of its GPUs, when it says nothing: the messages name what applies to it
_POD_COUNT = "nothing in the file says how many: no resources.limits[nvidia.com/gpu]"
UNSAID_COUNT = {
    "command": "a command line does not say how many GPUs it has",
    "shell": "a shell script does not say how many GPUs its launch has",
    "dockerfile": "a Dockerfile does not say how many GPUs its container gets (docker run --gpus does)",
    "vllm-config": "vLLM's config file does not say how many GPUs the launch has",
    "compose": "nothing in the file says how many: no deploy.resources.reservations.devices count or device_ids, "
    "no gpus:",
    "helm": "nothing in the values says how many: no requestGPU",
    "kubernetes": _POD_COUNT,
    "leaderworkerset": _POD_COUNT,
    "kserve": _POD_COUNT,
}
_POD_GPU = ("the file", "names no GPU (no nvidia.com/gpu.product node selector or affinity)")
UNSAID_GPU = {
    "command": ("the command line", "names no GPU"),
    "shell": ("the script", "names no GPU"),
    "dockerfile": ("the Dockerfile", "names no GPU"),
    "vllm-config": ("the config file", "names no GPU"),
    "compose": ("the file", "names no GPU (compose has no GPU model selector)"),
    "helm": _POD_GPU,
    "kubernetes": _POD_GPU,
    "leaderworkerset": _POD_GPU,
    "kserve": _POD_GPU,
}


def resolve_hardware(gpu: str | None, gpus: int | None, nodes: int | None, found: FoundLaunch | None) -> dict:
    """The launch request's ``hardware`` (``{"gpu", "count", "nodes"}``): what the file says wins (``found``: a
    ``nvidia.com/gpu.product`` label, the GPUs a container asks for, the nodes a LeaderWorkerSet spans) — a check of
    a whole repository gives ``--gpu`` / ``--gpus`` / ``--nodes`` as defaults, and a file's own GPU limit is the
    one its launch gets; the options fill in what the file does not say (and stand in for a label the catalogue
    does not know); else this machine's ``nvidia-smi``. Nothing is assumed: a GPU or a GPU count nobody states is a
    ResolveError saying which option gives it."""
    tried: list[tuple[str, str]] = []
    count = found.gpu_count if found is not None and found.gpu_count is not None else gpus
    node_count = found.nodes if found is not None and found.nodes is not None else nodes
    chosen: str | dict | None = _from_label(found, tried, fallback=gpu)
    if chosen is None:
        chosen = gpu
        tried.append(("--gpu", "not given" if gpu is None else f"{gpu!r}"))
    if chosen is None:
        smi = _from_nvidia_smi(tried)
        if smi is not None:
            chosen, smi_count = smi
            count = smi_count if count is None else count
    if chosen is None:
        raise ResolveError("no GPU: give --gpu NAME (a catalogue id or the name nvidia-smi prints)", tried)
    if count is None:
        kind = found.kind if found is not None else "command"
        raise ResolveError(
            f"no GPU count: give --gpus N (the GPUs of {chosen if isinstance(chosen, str) else chosen['name']} "
            f"the launch has per node; {UNSAID_COUNT.get(kind, UNSAID_COUNT['command'])})"
        )
    # a launch spans one node unless it is given more (vllm 0.33.0 config/parallel.py:326 ParallelConfig.nnodes = 1)
    return {"gpu": chosen, "count": count, "nodes": 1 if node_count is None else node_count}


def _from_label(found: FoundLaunch | None, tried: list[tuple[str, str]], fallback: str | None = None) -> str | None:
    """The catalogue id of a GPU-feature-discovery ``nvidia.com/gpu.product`` label. GFD writes the nvidia-smi
    name with its blanks as '-', then ``-MIG-<profile>`` for a MIG slice and ``-SHARED`` for a GPU shared by
    time-slicing or MPS (NVIDIA/k8s-device-plugin internal/lm/resource.go ``getProductName``, ``sanitise``); a slice
    or a shared GPU has not the GPU's memory to itself, so it is refused, not read as the whole GPU."""
    from ..domain.gpus import lookup

    label = found.gpu_product if found is not None else None
    if not label:
        kind = found.kind if found is not None else "command"
        tried.append(UNSAID_GPU.get(kind, ("the file", "a file of this kind names no GPU")))
        return None
    where = f"the file's nvidia.com/gpu.product {label[:120]!r}"
    problem = _label_problem(label, where)
    if problem is not None and fallback is not None:
        tried.append(("the file", f"{problem}: --gpu {fallback!r} stands in"))
        return None
    if re.search(r"-MIG-", label):
        raise ResolveError(
            f"{where} is a MIG slice, whose memory is a part of the GPU's: give --gpu with the slice's "
            '{"name", "compute_capability", "memory_bytes"} in a request file, or --gpu for the whole GPU'
        )
    if label.endswith("-SHARED"):
        raise ResolveError(
            f"{where} is a GPU shared by time-slicing or MPS: other pods use its memory too; give --gpu to check "
            "the launch as if it had the GPU to itself"
        )
    gpu = lookup(label)
    if gpu is None:
        raise ResolveError(f"{where} is not a GPU of the catalogue: give --gpu (a catalogue id or nvidia-smi name)")
    return gpu.id


def _label_problem(label: str, where: str) -> str | None:
    from ..domain.gpus import lookup

    if re.search(r"-MIG-", label):
        return f"{where} is a MIG slice"
    if label.endswith("-SHARED"):
        return f"{where} is a shared GPU"
    return None if lookup(label) is not None else f"{where} is not a GPU of the catalogue"


def _from_nvidia_smi(tried: list[tuple[str, str]]) -> tuple[str | dict, int] | None:
    """This machine's GPUs from ``nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader``
    (one line per GPU: ``NVIDIA H100 80GB HBM3, 81559 MiB, 9.0``): the catalogue id when the name is one, else the
    name, memory and capability it prints; and how many there are. None when there is no nvidia-smi."""
    from ..domain.gpus import lookup

    exe = shutil.which("nvidia-smi")
    if exe is None:
        tried.append(("nvidia-smi", "not on PATH"))
        return None
    out, problem = _run_bounded([exe, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader"])
    if problem:
        tried.append(("nvidia-smi", problem))
        return None
    rows = []
    for line in filter(None, (raw.strip() for raw in out.splitlines())):
        m = re.fullmatch(r"(.+?)\s*,\s*(\d+)\s*MiB\s*,\s*(\d+\.\d+)", line)
        if m is None or CONTROL.search(line):
            tried.append(("nvidia-smi", f"a line that is not NAME, N MiB, MAJOR.MINOR: {line[:120]!r}"))
            return None
        rows.append((m.group(1), int(m.group(2)), m.group(3)))
    if not rows:
        tried.append(("nvidia-smi", "lists no GPU"))
        return None
    kinds = sorted({r[0] for r in rows})
    if len(kinds) > 1:
        raise ResolveError(f"this machine has GPUs of {len(kinds)} kinds ({', '.join(kinds)[:300]}): give --gpu")
    name, mib, cap = rows[0]
    known = lookup(name)
    if known is not None:
        return known.id, len(rows)
    return {"name": name[:256], "compute_capability": cap, "memory_bytes": mib << 20}, len(rows)


def _run_bounded(argv: list[str]) -> tuple[str, str | None]:
    """``argv``'s standard output, at most NVIDIA_SMI_MAX_BYTES of it and at most NVIDIA_SMI_TIMEOUT seconds: the
    process and anything it started are killed at the deadline (a session of its own, killed as a group)."""
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:
        return "", f"cannot run: {exc.strerror or exc.__class__.__name__}"

    def kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    timer = threading.Timer(NVIDIA_SMI_TIMEOUT, kill)
    timer.start()
    try:
        assert proc.stdout is not None
        data = proc.stdout.read(NVIDIA_SMI_MAX_BYTES + 1)
        late = not timer.is_alive()
        kill()  # whatever is left of it, and its children
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.stdout is not None:
            proc.stdout.close()
    if late:
        return "", f"no answer in {NVIDIA_SMI_TIMEOUT:g} s"
    if len(data) > NVIDIA_SMI_MAX_BYTES:
        return "", f"more than {NVIDIA_SMI_MAX_BYTES} bytes of output"
    if rc not in (0, -signal.SIGKILL):  # -SIGKILL: ended by us after it closed its output
        first = data.decode("utf-8", "replace").strip().splitlines()[:1]
        return "", f"exit status {rc}" + (f" ({first[0][:200]})" if first else "")
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return "", "output that is not UTF-8"
