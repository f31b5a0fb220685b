"""Request bodies of the HTTP API (unknown fields are refused)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ...domain import weights_expect
from ...domain.jsoncheck import JsonValueError, check_json
from ...domain.posted_argv import MAX_ELEMENT_CHARS, MAX_ELEMENTS, MAX_TOTAL_CHARS
from ...domain.request import (
    ENV_NAME,
    Checkpoint,
    CustomGpu,
    DisplayStr,
    LaunchRequest,
    TensorLinear,
    TensorRanks,
    Workload,
)
from ...domain.text import display_text, display_text_problem
from ...domain.topology import MAX_ADDRESS, address_problem

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def node_name(value: str) -> str:
    """A node name as stored: lower case (``NODE-A`` and ``node-a`` are one node, as DNS names are), never with a
    final dot (``node-a.`` would be the same host under another spelling). ValueError for a final dot."""
    if value.endswith("."):
        raise ValueError(f"a node name does not end with a dot: {value[:-1]!r}, not {value!r}")
    return value.lower()


# Node names as every request carries them (registration, paths, plan and rollout node lists): NAME, then node_name.
NodeNameStr = Annotated[str, Field(pattern=NAME), AfterValidator(node_name)]
ADDRESS_DOC = (
    "IP address or DNS name the other nodes of a multi-node instance reach this node at (rendered as "
    "--master-addr / --data-parallel-address when it heads a group); required for a head. Loopback, unspecified and "
    "link-local addresses and names (localhost, *.localhost) are refused: other nodes would reach themselves"
)


def _address(value: str | None) -> str | None:
    if value is not None:
        problem = address_problem(value)
        if problem:
            raise ValueError(problem)
    return value


MAX_ENV_BYTES = 16_384  # one plan's (or group's) environment: it is copied into every node's signed plan


def _env_names(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key) or len(value) > 4096:
            raise ValueError(
                f"env: {key!r} is not a valid environment variable name (A-Z, 0-9, _) or its value is longer than 4096"
            )
        if any(c in value for c in "\n\r\0"):
            raise ValueError(f"env: the value of {key!r} holds a line break or NUL")
        problem = display_text_problem(value, allow_tab=True)
        if problem:  # printed in the node's command line: it must read as what runs
            raise ValueError(f"env: the value of {key!r} {problem}")
    size = sum(len(k) + len(v) for k, v in env.items())
    if size > MAX_ENV_BYTES:
        raise ValueError(
            f"env: {len(env)} variables of {size} characters in all, more than {MAX_ENV_BYTES} (it is "
            f"signed into every node's plan)"
        )
    return env


ARGV_DOC = (
    'The launch as a command line instead of engine_args: ["vllm", "serve", MODEL, "--option", "value", …] (or '
    '["python", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, …]), read exactly as the release\'s '
    "parser reads it (abbreviations, --x_y spellings, dotted keys, repeated options: the last wins). MODEL must be the "
    "model the request names. --config is refused (the file is not on the service). A 422 names the element "
    f"(argv[i]) the parser would refuse. At most {MAX_ELEMENTS} elements of {MAX_ELEMENT_CHARS} characters, "
    f"{MAX_TOTAL_CHARS} in all."
)
ArgvList = list[Annotated[str, Field(max_length=MAX_ELEMENT_CHARS)]]


def argv_alone(argv: list[str] | None, fields_set: set[str]) -> None:
    """A launch is given as ``argv`` or as ``engine_args``, never both (which one would it mean?); ``argv`` bounded."""
    if argv is None:
        return
    if "engine_args" in fields_set:
        raise JsonValueError("argv", "give the launch as argv or as engine_args, not both")
    total = sum(len(w) for w in argv)
    if total > MAX_TOTAL_CHARS:
        raise JsonValueError("argv", f"{total} characters in all, more than {MAX_TOTAL_CHARS}")


class Strict(BaseModel):
    """Unknown fields refused; every value plain JSON (finite numbers, integers within ±2^53, no NUL)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any) -> Any:
        check_json(data)
        return data


class ObservedGpuIn(Strict):
    index: Annotated[int, Field(ge=0, le=1023, strict=True)] = Field(description="nvidia-smi's GPU index.")
    name: DisplayStr = Field(min_length=1, max_length=128, description="The GPU's name as nvidia-smi prints it.")
    memory_total_bytes: Annotated[int, Field(ge=0, le=1 << 50, strict=True)] = Field(
        description="memory.total, in bytes."
    )
    memory_used_bytes: Annotated[int, Field(ge=0, le=1 << 50, strict=True)] = Field(
        description="memory.used when it was read, in bytes."
    )
    compute_capability: str = Field(pattern=r"^\d{1,2}\.\d$", description="compute_cap, e.g. 9.0.")
    bus_id: DisplayStr = Field(max_length=32, description="pci.bus_id, e.g. 00000000:18:00.0.")


class NodeFactsIn(Strict):
    """A node's hardware facts as nvidia-smi reads them (``preflight agent register``; the agent after drift).

    ``gpu`` and ``gpu_count`` are required and replace the stored ones. The optional facts (``interconnect``,
    ``gpus``, ``address``) are merged: a field left out keeps the stored value, an explicit ``null`` clears it. The
    facts must agree with themselves (else 422 naming the field): ``gpus`` lists ``gpu_count`` GPUs with distinct
    indices, all of one model (a node of mixed models is refused: Preflight validates a node as one GPU model), the
    model ``gpu`` names."""

    gpu: DisplayStr | CustomGpu = Field(description="Catalogue id, nvidia-smi name, or an inline description.")
    gpu_count: Annotated[int, Field(ge=1, le=64, strict=True)] = Field(
        description="GPUs in the node (replaces the stored count)."
    )
    interconnect: Literal["nvlink", "pcie"] | None = Field(
        default=None, description=("Left out: the stored interconnect stays; null: unknown (cleared).")
    )
    gpus: list[ObservedGpuIn] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Each GPU as read (gpu_count of them, one model). Left out: the stored list stays (if it still agrees with "
            "gpu and gpu_count, else 422); null clears it."
        ),
    )
    address: str | None = Field(
        default=None,
        max_length=MAX_ADDRESS,
        description=(ADDRESS_DOC + ". Left out: the stored address stays; null clears it."),
    )
    rotate_token: bool = Field(
        default=False,
        description=(
            "Issue a new agent token (revoking the node's others). Always done when the node is created; an agent "
            "token may not ask for it."
        ),
    )

    _check_address = field_validator("address")(_address)


class NodeIn(Strict):
    name: NodeNameStr = Field(
        description="Node name (hostname-like; case does not matter: stored in lower case; no final dot)."
    )
    gpu: DisplayStr | CustomGpu = Field(description="Catalogue id, nvidia-smi name, or an inline description.")
    gpu_count: Annotated[int, Field(ge=1, le=64, strict=True)] = Field(description="GPUs in the node.")
    interconnect: Literal["nvlink", "pcie"] | None = Field(
        default=None, description="nvlink or pcie between the node's GPUs; unknown when left out."
    )
    address: str | None = Field(default=None, max_length=MAX_ADDRESS, description=ADDRESS_DOC)
    labels: dict[
        Annotated[DisplayStr, Field(min_length=1, max_length=128)], Annotated[DisplayStr, Field(max_length=256)]
    ] = Field(default_factory=dict, max_length=64, description="Free-form labels (rollout selectors match them).")

    _check_address = field_validator("address")(_address)


SHA256_HEX = r"^[0-9a-f]{64}$"


class WeightsShard(Strict):
    name: str = Field(min_length=1, max_length=255, description="A plain file name in the weights directory.")
    size: Annotated[int, Field(ge=0, le=1 << 50, strict=True)] = Field(description="The file's size in bytes.")
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_HEX,
        description="SHA-256 of the file's bytes (checked by the agent with --verify-hashes).",
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        from ...agent.weights import shard_name_problem

        problem = shard_name_problem(name)
        if problem:  # a path in a shard name would send the node's check outside its weights directory
            raise ValueError(problem)
        return name


class WeightsFiles(Strict):
    """What the launch depends on in the weights directory (``preflight manifest push`` records it); each node checks
    it before vLLM starts (service/agent/weights.py)."""

    config_sha256: str = Field(pattern=SHA256_HEX, description="SHA-256 of config.json's bytes.")
    quantization: str | None = Field(
        default=None,
        max_length=64,
        description="Set by the service from quantization_txt (any value sent is replaced).",
    )
    hf_quant_config_sha256: str | None = Field(
        default=None,
        pattern=SHA256_HEX,
        description="SHA-256 of hf_quant_config.json's bytes, when the checkpoint has one.",
    )
    total_size: Annotated[int, Field(ge=0, le=1 << 50, strict=True)] | None = Field(
        default=None, description="The index's metadata.total_size (bytes of all shards)."
    )
    shards: list[WeightsShard] = Field(
        default_factory=list,
        max_length=4096,
        description="Every weight file the node must hold, with its size (and digest).",
    )

    @field_validator("shards")
    @classmethod
    def _unique(cls, shards: list[WeightsShard]) -> list[WeightsShard]:
        names = [s.name for s in shards]
        if len(set(names)) != len(names):
            raise ValueError("shard names must be unique")
        return shards


Count = Annotated[int, Field(ge=0, le=500_000, strict=True)]
Bytes = Annotated[int, Field(ge=0, le=1 << 50, strict=True)]
SafetensorsDtype = Literal[
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "F64",
    "C64",
    "I64",
    "U64",
]  # fmt: skip  (service/domain/tensors.py DTYPE_BITS: safetensors' Dtype)
TensorScheme = Literal["none", "gptq", "awq", "int_pack", "int8", "fp8", "nvfp4", "mxfp4", "bitsandbytes"]


class TensorsDtypeTotal(Strict):
    tensors: Count = Field(description="How many tensors of this dtype.")
    bytes: Bytes = Field(description="Their bytes.")


class TensorsFile(Strict):
    name: str = Field(min_length=1, max_length=255, description="A plain file name in the weights directory.")
    header_bytes: Annotated[int, Field(ge=0, le=100_000_000, strict=True)] = Field(description="Its header's N.")
    data_bytes: Bytes = Field(description="Its data buffer's bytes.")
    tensors: Count = Field(description="How many tensors it holds.")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        return WeightsShard._plain_name(name)


class TensorsUnquantized(Strict):
    modules: DisplayStr = Field(max_length=1100, description="A module name pattern (layer numbers as *).")
    count: Count = Field(description="How many modules match it.")


class TensorsFormat(Strict):
    """The quantization the tensors show (service/domain/tensor_format.py ``TensorFormat.as_dict``)."""

    scheme: TensorScheme = Field(description="The quantized layout most modules use; none when no module is.")
    schemes: dict[TensorScheme, Count] = Field(default_factory=dict, description="Modules per layout.")
    evidence: str | None = Field(default=None, max_length=1024, description="A tensor that shows the layout.")
    bits: Annotated[int, Field(ge=1, le=64, strict=True)] | None = Field(
        default=None, description="Bits per weight, when the shapes fix them."
    )
    group_size: Annotated[int, Field(ge=-1, le=1 << 20, strict=True)] | None = Field(
        default=None, description="Quantization group size from the scale shapes (-1: one group, channelwise)."
    )
    granularity: Literal["tensor", "channel", "block"] | None = Field(
        default=None, description="FP8 scale granularity: per tensor, per channel, or per block."
    )
    block: list[Annotated[int, Field(ge=1, le=1 << 20, strict=True)]] | None = Field(
        default=None, min_length=2, max_length=2, description="FP8 block (block_n, block_k) from the scale shapes."
    )
    weight_dtype: SafetensorsDtype | None = Field(default=None, description="The dtype of the unquantized linears.")
    unquantized: list[TensorsUnquantized] = Field(
        default_factory=list, max_length=32, description="Modules left unquantized in a quantized checkpoint."
    )


class TensorsInventory(Strict):
    """The checkpoint's tensor inventory from its safetensors headers (``preflight manifest push`` reads it:
    service/domain/tensors.py ``Inventory.summary``, plus ``format``). Nodes recompute the layout digest."""

    layout_digest: str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$", description="SHA-256 over every tensor's (name, dtype, shape)."
    )
    tensor_count: Count = Field(description="How many tensors in all.")
    total_bytes: Bytes = Field(description="The tensors' bytes in all (exact: from the headers).")
    by_dtype: dict[SafetensorsDtype, TensorsDtypeTotal] = Field(description="Counts and bytes per dtype.")
    files: list[TensorsFile] = Field(default_factory=list, max_length=4096, description="Per safetensors file.")
    format: TensorsFormat = Field(description="The quantization the tensors show.")
    ranks: TensorRanks | None = Field(
        default=None, description="Bytes per decoder layer by how vLLM shards them (service/domain/rank_weights.py)."
    )

    linears: list[TensorLinear] | None = Field(
        default=None,
        max_length=1024,
        description="Distinct linear module layouts with their tensors' shapes (service/domain/linear_shapes.py).",
    )

    @model_validator(mode="after")
    def _totals(self) -> TensorsInventory:
        if sum(t.tensors for t in self.by_dtype.values()) != self.tensor_count:
            raise ValueError("by_dtype's tensors do not add up to tensor_count")
        if sum(t.bytes for t in self.by_dtype.values()) != self.total_bytes:
            raise ValueError("by_dtype's bytes do not add up to total_bytes")
        if self.files and (
            sum(f.tensors for f in self.files) != self.tensor_count
            or sum(f.data_bytes for f in self.files) != self.total_bytes
        ):
            raise ValueError("the files' tensors and bytes do not add up to tensor_count and total_bytes")
        if len({f.name for f in self.files}) != len(self.files):
            raise ValueError("file names must be unique")
        if self.ranks is not None and self.ranks.total() != self.total_bytes:
            raise ValueError("ranks' bytes do not add up to total_bytes")
        return self


class ManifestIn(Strict):
    name: DisplayStr = Field(
        min_length=1,
        max_length=256,
        description="The model's name (a Hugging Face id or your own); with version, what plans name.",
    )
    version: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$", description="The weight version (letters, digits, . _ + -)."
    )
    uri: DisplayStr = Field(min_length=1, max_length=2048, description="Where nodes load the weights from.")
    config: dict[str, Any] = Field(description="The model's config.json object.")
    quantization_txt: str | None = Field(
        default=None,
        max_length=65536,
        description="The weight version's quantization.txt (its format tag): the quantization Preflight renders.",
    )
    hf_quant_config: dict[str, Any] | None = Field(
        default=None, description="hf_quant_config.json (ModelOpt checkpoints), when the checkpoint has one."
    )
    checkpoint: Checkpoint = Field(
        default_factory=Checkpoint, description="How the weights are laid out on disk (merged, or saved per rank)."
    )
    weights_bytes: Annotated[int, Field(ge=0, le=1 << 50, strict=True)] | None = Field(
        default=None, description="Total size of the weight files in bytes (the memory model splits it when given)."
    )
    digests: dict[Annotated[DisplayStr, Field(max_length=1024)], Annotated[DisplayStr, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=4096, description="Digests of the weight files by name (recorded as given)."
    )
    allow_remote_code: bool = Field(
        default=False,
        description=(
            "Whether plans for this model may set trust_remote_code in production (the code in the model repository "
            "runs on the node); without it such a plan is refused (rule trust_remote_code_not_allowed)."
        ),
    )
    files: WeightsFiles | None = Field(
        default=None,
        description=("The weights files the launch depends on; recorded, every node checks them before vLLM starts."),
    )
    tensors: TensorsInventory | None = Field(
        default=None,
        description=(
            "The tensor inventory from the checkpoint's safetensors headers (``preflight manifest push`` reads it): "
            "registration refuses a quantization tag or config the tensors contradict (quant_mismatch)."
        ),
    )


class LaunchTarget(Strict):
    """What a plan (or every wave of a rollout) launches: the manifest, the engine arguments and the rest of the
    launch request, without the nodes."""

    manifest: str | Annotated[int, Field(ge=1, le=2**62)] | dict[str, str] = Field(
        description="Manifest id, name@version, or name (newest)."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vllm serve options by name (any spelling), with JSON values as vLLM's parser reads them.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for vLLM (A-Z, 0-9, _).")
    environment: Literal["production", "benchmark"] = Field(
        default="production",
        description="production or benchmark: the policy profile decides which operators' rules refuse or warn.",
    )
    workload: Workload | None = Field(
        default=None,
        description="Expected traffic; with it, left-out engine arguments are filled with recommended values.",
    )
    vllm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The vLLM release the nodes run (default: the newest line Preflight knows).",
    )
    kv_cache_pool: Literal["utilization", "pinned"] = Field(
        default="utilization",
        description=(
            "utilization: vLLM sizes the KV pool from gpu_memory_utilization at every start. pinned: render "
            "--kv-cache-memory-bytes with the pool a node of this plan reported for the same manifest, vLLM version and "
            "engine arguments (vLLM's own suggestion, else its printed 'Available KV cache memory'), so every replica "
            "gets the same pool; 422 kv_pool_not_measured when none was reported."
        ),
    )
    multi_node_form: Literal["nnodes", "data_parallel"] | None = Field(
        default=None,
        description=(
            "How an instance that spans several nodes is launched: ``nnodes`` (vLLM's multiprocessing form, --nnodes/"
            "--node-rank/--master-addr/--master-port, --headless workers; the default) or ``data_parallel`` (only DP "
            "spans nodes: --data-parallel-size-local/--data-parallel-start-rank/--data-parallel-address/"
            "--data-parallel-rpc-port, --headless followers)."
        ),
    )

    _check_env = field_validator("env")(_env_names)


class PlanIn(LaunchTarget):
    nodes: list[NodeNameStr] = Field(
        min_length=1,
        max_length=256,
        description="The registered nodes the plan runs on (a multi-node instance: its nodes in rank order).",
    )
    argv: ArgvList | None = Field(
        default=None,
        max_length=MAX_ELEMENTS,
        description=ARGV_DOC + " MODEL is the manifest's name or uri; the plan records the argv as posted.",
    )
    group_env: list[dict[str, str]] | None = Field(
        default=None,
        max_length=256,
        description=(
            "Environment per group (instance), in group order, added to ``env`` on every node of that group (e.g. "
            "GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); the same env policy applies."
        ),
    )
    tuning: TuningIn | None = Field(
        default=None,
        description=(
            "The tuning loop (GET /v1/nodes/{name}/tuning): the SLO its levels are judged against and auto_apply "
            "(benchmark only)."
        ),
    )
    weights_check: Literal["verify", "skip"] = Field(
        default="verify",
        description=(
            "verify (the default): every node compares its weights with what the plan was judged for (config.json's "
            "digest, quantization.txt's tag, the layout digest when known) before vLLM starts, and a production plan "
            "is refused by a node that cannot compare (a remote uri with no --weights-root). skip: the nodes do not "
            "check the weights; needs weights_check_reason, and is audited (plan.weights_check_skipped)."
        ),
    )
    weights_check_reason: DisplayStr | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Why the weights are not checked (required with weights_check skip; recorded in the audit).",
    )
    weights_signer: dict[str, str] | None = Field(
        default=None,
        description=(
            "Who must have signed the weights (OpenSSF model signing, the ``model.sig`` in the weights directory): "
            '{"public_key": "<PEM EC public key>"} or {"identity": "...", "oidc_issuer": "https://..."} (Sigstore). '
            "Every node then verifies the signature before vLLM starts; no signature, or one it cannot verify, is "
            "refused in production (docs/agent.md). Agents older than this field refuse such a plan."
        ),
        json_schema_extra={"maxProperties": 2},
    )

    @field_validator("weights_signer")
    @classmethod
    def _signer_known(cls, signer: dict[str, str] | None) -> dict[str, str] | None:
        problem = None if signer is None else weights_expect.signer_problem(signer)
        if problem:
            raise JsonValueError("weights_signer", problem)
        return signer

    @model_validator(mode="after")
    def _argv_alone(self) -> PlanIn:
        argv_alone(self.argv, self.model_fields_set)
        return self

    @model_validator(mode="after")
    def _skip_has_a_reason(self) -> PlanIn:
        reason = (self.weights_check_reason or "").strip()
        if self.weights_check == "skip" and not reason:
            raise JsonValueError(
                "weights_check_reason", "weights_check skip needs a reason (who is skipping the check, and why)"
            )
        if self.weights_check == "verify" and self.weights_check_reason is not None:
            raise JsonValueError("weights_check_reason", 'is read only with "weights_check": "skip"')
        if self.weights_check == "skip" and self.weights_signer is not None:
            raise JsonValueError("weights_signer", 'a plan signed with "weights_check": "skip" checks no signature')
        return self

    @field_validator("group_env")
    @classmethod
    def _group_env_names(cls, envs: list[dict[str, str]] | None) -> list[dict[str, str]] | None:
        for env in envs or ():
            if len(env) > 256:
                raise ValueError("at most 256 variables per group")
            _env_names(env)
        return envs


MAX_KV_TOKENS = 2**40  # far above any GPU pool; keeps the calibration columns (BIGINT) and arithmetic in range
MAX_KV_GIB = 2.0**20  # 1 PiB


class ReportIn(Strict):
    """An agent's report on its node's plan. The lifecycle of one run: ``started`` (spawned), ``running`` (vLLM
    serving, with what it printed), ``heartbeat`` (periodic, cheap: stamps the assignment only), then ``stopped``
    (asked to stop: ``details.signal``) or ``exited`` (ended by itself: ``details.status``, ``details.tail``).
    Also ``fetched``, ``refused`` (a check failed before anything ran: ``details.reason``; may name no plan),
    ``reset`` (the node's state reset on purpose; may name no plan) and ``failed`` (older agents).
    ``details.run_id`` ties the reports of one run together (``GET /v1/nodes/{name}/runs``)."""

    plan_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=36,
        description="The plan the report is about (may be null only for refused and reset).",
    )
    status: Literal["fetched", "started", "running", "heartbeat", "stopped", "exited", "refused", "reset", "failed"] = (
        Field(
            description="What happened: fetched, started, running, heartbeat, stopped, exited, refused, reset "
            "or failed."
        )
    )
    message: str | None = Field(
        default=None,
        max_length=65536,
        description="A line for people (what vLLM printed last, why the agent refused, …).",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Free-form; ``details.vllm`` carries what vLLM printed at start-up for the calibration loop: "
            f"``kv_cache_tokens`` (integer, 1..2^40) and ``available_kv_cache_gib`` (number, 0..{MAX_KV_GIB:.0f})."
        ),
    )

    @model_validator(mode="after")
    def _plan_named(self) -> ReportIn:
        if self.plan_id is None and self.status not in ("refused", "reset"):
            raise JsonValueError("plan_id", f"a {self.status} report must name its plan_id")
        run_id = self.details.get("run_id")
        if run_id is not None and not (isinstance(run_id, str) and 0 < len(run_id) <= 64):
            raise JsonValueError("details.run_id", "must be a string of 1 to 64 characters")
        return self

    @field_validator("details")
    @classmethod
    def _vllm_figures(cls, details: dict[str, Any]) -> dict[str, Any]:
        """The figures the calibration loop stores must be numbers in range (services/calibration.py)."""
        vllm = details.get("vllm")
        if vllm is None:
            return details
        if not isinstance(vllm, dict):
            raise JsonValueError("vllm", "must be an object of vLLM's start-up figures")
        tokens = vllm.get("kv_cache_tokens")
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_KV_TOKENS
        ):
            raise JsonValueError("vllm.kv_cache_tokens", "must be an integer from 1 to 2^40")
        gib = vllm.get("available_kv_cache_gib")
        if gib is not None and (
            isinstance(gib, bool) or not isinstance(gib, (int, float)) or not 0 <= gib <= MAX_KV_GIB
        ):
            raise JsonValueError("vllm.available_kv_cache_gib", f"must be a number from 0 to {MAX_KV_GIB:.0f}")
        return details


class TokenIn(Strict):
    role: Literal["admin", "deployer", "auditor", "enroller"] = Field(
        description="admin, deployer (plans, manifests, rollouts), auditor (reads and the audit) or "
        "enroller (registers nodes)."
    )
    label: DisplayStr | None = Field(
        default=None, max_length=256, description="A name for people (shown in listings and the audit)."
    )


class NodeUpdate(Strict):
    gpu_count: Annotated[int, Field(ge=1, le=64, strict=True)] | None = Field(
        default=None, description="GPUs in the node."
    )
    interconnect: Literal["nvlink", "pcie"] | None = Field(
        default=None, description="nvlink or pcie between the node's GPUs."
    )
    address: str | None = Field(default=None, max_length=MAX_ADDRESS, description=ADDRESS_DOC)

    _check_address = field_validator("address")(_address)
    labels: (
        dict[Annotated[DisplayStr, Field(min_length=1, max_length=128)], Annotated[DisplayStr, Field(max_length=256)]]
        | None
    ) = Field(default=None, max_length=64, description="Free-form labels; replaces the stored ones.")


# -- tuning -------------------------------------------------------------------------------------------
def _num(hi: float, doc: str) -> Any:
    """The constraints of a window's number (finite, 0 to ``hi``): ``Annotated[float, _num(hi, doc)]``."""
    return Field(ge=0, le=hi, allow_inf_nan=False, strict=True, description=doc)


MAX_WINDOW_S = 3600.0


class MetricsWindowIn(Strict):
    """One window of vLLM's live metrics as the node's agent computed it from vLLM's /metrics (``preflight agent
    run --exec`` samples every ``--metrics-seconds``): gauges at the window's end, counter deltas over the window, P99s
    from histogram bucket deltas (null when no request finished in the window). Every number finite and ≥ 0."""

    plan: str = Field(
        min_length=1,
        max_length=36,
        description="The plan that ran in the window (the node's current plan or one of its recent ones).",
    )
    window_s: Annotated[
        float,
        Field(
            ge=1,
            le=MAX_WINDOW_S,
            allow_inf_nan=False,
            strict=True,
            description="The window's length in seconds (1 to 3600).",
        ),
    ]
    num_requests_running: Annotated[float, _num(1e7, "vllm:num_requests_running at the window's end")]
    num_requests_waiting: Annotated[float, _num(1e9, "vllm:num_requests_waiting at the window's end")]
    kv_cache_usage_perc: Annotated[
        float, _num(1.0, "vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before its rename), 0..1")
    ]
    num_preemptions: Annotated[float, _num(1e9, "the increase of vllm:num_preemptions_total over the window")]
    ttft_p99_s: Annotated[float, _num(1e6, "P99 of vllm:time_to_first_token_seconds over the window")] | None = Field(
        default=None,
        description="P99 of vllm:time_to_first_token_seconds over the window (null: no request finished its prefill).",
    )
    e2e_p99_s: Annotated[float, _num(1e6, "P99 of vllm:e2e_request_latency_seconds over the window")] | None = Field(
        default=None, description="P99 of vllm:e2e_request_latency_seconds over the window (null: no request finished)."
    )
    generation_tokens_per_s: Annotated[
        float, _num(1e9, "the increase of vllm:generation_tokens_total over the window ÷ window_s")
    ]


class TuningIn(Strict):
    """The tuning loop's settings for a plan: the workload's latency objective (P99, seconds; a level
    whose P99 goes beyond it fails like one that preempts) and ``auto_apply`` (the service applies the loop's next
    plan itself as soon as the windows decide it: allowed only in the ``benchmark`` environment)."""

    auto_apply: bool = Field(
        default=False, description="Apply the loop's next plan by itself (benchmark environment only)."
    )
    slo_ttft_p99_s: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = Field(
        default=None, description="Time-to-first-token P99 the loop must keep, in seconds."
    )
    slo_e2e_p99_s: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] | None = Field(
        default=None, description="End-to-end latency P99 the loop must keep, in seconds."
    )


PlanIn.model_rebuild()  # its tuning block is defined below it


class WaveIn(Strict):
    percent: Annotated[
        int,
        Field(
            strict=True,
            description="Cumulative share of the rollout's nodes changed by the "
            "end of this wave (rising, the last 100).",
        ),
    ]
    bake_s: Annotated[
        int, Field(strict=True, description="Seconds the wave runs, every unit ready, before the next one starts.")
    ] = 0


class GatesIn(Strict):
    ready_timeout_s: Annotated[
        int,
        Field(
            ge=1,
            le=86400,
            strict=True,
            description=("Every node of a wave reports running within this many seconds of its signing, or it failed."),
        ),
    ] = 600
    kv_tolerance: (
        Annotated[
            float,
            Field(
                ge=0,
                le=10,
                strict=True,
                description=(
                    "The KV cache tokens vLLM printed may differ from the prediction by at most this fraction of it (null: not "
                    "judged)."
                ),
            ),
        ]
        | None
    ) = Field(default=0.2, description="Tolerance on KV cache tokens vs the prediction (0.2: ±20 %; null: not judged).")


class SelectorIn(Strict):
    gpu: str | None = Field(default=None, min_length=1, max_length=128, description="Catalogue id or nvidia-smi name.")
    gpu_count: Annotated[int, Field(ge=1, le=64, strict=True)] | None = Field(
        default=None, description="Only nodes with this many GPUs."
    )
    labels: dict[str, Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=64, description="Every label must match."
    )


MAX_ROLLOUT_NODES = 1024


class RolloutIn(LaunchTarget):
    """A staged rollout: the target (as for a plan, without nodes; the manifest, the engine arguments with the
    recommended values filled in, the vLLM version and a pinned KV pool are decided once, at creation), the nodes
    (names or a selector), the waves, the failure limit and the gates."""

    nodes: list[NodeNameStr] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ROLLOUT_NODES,
        description="Node names, in the order waves take them.",
    )
    selector: SelectorIn | None = Field(default=None, description="Or: every registered node matching (by name).")
    waves: list[WaveIn] = Field(
        min_length=1,
        max_length=20,
        description="The waves, in order: cumulative percents of the nodes (the last 100), each with its bake time.",
    )
    failure_limit: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_ROLLOUT_NODES,
            strict=True,
            description=(
                "Units (a node, or a multi-node instance) that may fail before the rollout halts and restores every node it "
                "changed."
            ),
        ),
    ] = 0
    gates: GatesIn = Field(
        default_factory=GatesIn, description="What each node of a wave must show before the rollout moves on."
    )
    paused: Annotated[bool, Field(strict=True)] | None = Field(
        default=False,
        description=(
            "Create it paused: nothing is signed until POST /v1/rollouts/{id}/resume (read the 201's judged findings "
            "first)."
        ),
    )


class RolloutCommandIn(Strict):
    reason: str | None = Field(
        default=None,
        max_length=1000,
        description=(
            "Recorded in the audit event. Plain text: control characters (C0, DEL, C1), bidi and other invisible "
            "formatting characters are refused (service/domain/text.py)."
        ),
    )

    @field_validator("reason")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        return None if v is None else display_text(v)


class ValidateIn(LaunchRequest):
    """``POST /v1/validate``: a launch given inline (the format of ``preflight check``), its engine arguments as
    ``engine_args`` or as ``argv``."""

    argv: ArgvList | None = Field(
        default=None,
        max_length=MAX_ELEMENTS,
        description=ARGV_DOC + " MODEL is model.uri or model.name when given (else it becomes model.uri).",
    )

    @model_validator(mode="after")
    def _argv_alone(self) -> ValidateIn:
        argv_alone(self.argv, self.model_fields_set)
        return self
