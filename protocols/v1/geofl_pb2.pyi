from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_INT16: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
    DTYPE_UINT32: _ClassVar[DType]
    DTYPE_UINT16: _ClassVar[DType]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_NONE: _ClassVar[Codec]
    CODEC_FP16: _ClassVar[Codec]
    CODEC_BF16: _ClassVar[Codec]
    CODEC_QSGD: _ClassVar[Codec]
    CODEC_TOPK: _ClassVar[Codec]
    CODEC_RANDK: _ClassVar[Codec]
    CODEC_POWERSGD: _ClassVar[Codec]
    CODEC_SIGN: _ClassVar[Codec]

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_UNSPECIFIED: _ClassVar[TaskKind]
    TASK_KIND_WAIT: _ClassVar[TaskKind]
    TASK_KIND_FIT: _ClassVar[TaskKind]
    TASK_KIND_EVALUATE: _ClassVar[TaskKind]
    TASK_KIND_SHUTDOWN: _ClassVar[TaskKind]
    TASK_KIND_SECAGG_ADVERTISE: _ClassVar[TaskKind]
    TASK_KIND_SECAGG_SHARE: _ClassVar[TaskKind]
    TASK_KIND_SECAGG_UNMASK: _ClassVar[TaskKind]
    TASK_KIND_MESSAGE: _ClassVar[TaskKind]

class UpdateKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_KIND_UNSPECIFIED: _ClassVar[UpdateKind]
    UPDATE_KIND_DELTA: _ClassVar[UpdateKind]
    UPDATE_KIND_NONE: _ClassVar[UpdateKind]
    UPDATE_KIND_MASKED: _ClassVar[UpdateKind]
    UPDATE_KIND_FULL: _ClassVar[UpdateKind]

class ResultStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_STATUS_UNSPECIFIED: _ClassVar[ResultStatus]
    RESULT_STATUS_OK: _ClassVar[ResultStatus]
    RESULT_STATUS_CLIENT_ERROR: _ClassVar[ResultStatus]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT64: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT8: DType
DTYPE_INT16: DType
DTYPE_INT32: DType
DTYPE_INT64: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
DTYPE_UINT32: DType
DTYPE_UINT16: DType
CODEC_UNSPECIFIED: Codec
CODEC_NONE: Codec
CODEC_FP16: Codec
CODEC_BF16: Codec
CODEC_QSGD: Codec
CODEC_TOPK: Codec
CODEC_RANDK: Codec
CODEC_POWERSGD: Codec
CODEC_SIGN: Codec
TASK_KIND_UNSPECIFIED: TaskKind
TASK_KIND_WAIT: TaskKind
TASK_KIND_FIT: TaskKind
TASK_KIND_EVALUATE: TaskKind
TASK_KIND_SHUTDOWN: TaskKind
TASK_KIND_SECAGG_ADVERTISE: TaskKind
TASK_KIND_SECAGG_SHARE: TaskKind
TASK_KIND_SECAGG_UNMASK: TaskKind
TASK_KIND_MESSAGE: TaskKind
UPDATE_KIND_UNSPECIFIED: UpdateKind
UPDATE_KIND_DELTA: UpdateKind
UPDATE_KIND_NONE: UpdateKind
UPDATE_KIND_MASKED: UpdateKind
UPDATE_KIND_FULL: UpdateKind
RESULT_STATUS_UNSPECIFIED: ResultStatus
RESULT_STATUS_OK: ResultStatus
RESULT_STATUS_CLIENT_ERROR: ResultStatus

class Scalar(_message.Message):
    __slots__ = ("double", "int", "bool", "string", "bytes")
    DOUBLE_FIELD_NUMBER: _ClassVar[int]
    INT_FIELD_NUMBER: _ClassVar[int]
    BOOL_FIELD_NUMBER: _ClassVar[int]
    STRING_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    double: float
    int: int
    bool: bool
    string: str
    bytes: bytes
    def __init__(self, double: _Optional[float] = ..., int: _Optional[int] = ..., bool: _Optional[bool] = ..., string: _Optional[str] = ..., bytes: _Optional[bytes] = ...) -> None: ...

class CodecStep(_message.Message):
    __slots__ = ("codec", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    CODEC_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    codec: Codec
    params: _containers.MessageMap[str, Scalar]
    def __init__(self, codec: _Optional[_Union[Codec, str]] = ..., params: _Optional[_Mapping[str, Scalar]] = ...) -> None: ...

class Encoding(_message.Message):
    __slots__ = ("steps", "dtype", "shape")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[CodecStep]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, steps: _Optional[_Iterable[_Union[CodecStep, _Mapping]]] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class CompressionPlan(_message.Message):
    __slots__ = ("steps", "min_bytes", "error_feedback", "max_staleness")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[CodecStep]
    min_bytes: int
    error_feedback: bool
    max_staleness: int
    def __init__(self, steps: _Optional[_Iterable[_Union[CodecStep, _Mapping]]] = ..., min_bytes: _Optional[int] = ..., error_feedback: _Optional[bool] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("protocol_versions", "node_name", "region", "node_config", "client_version", "proof")
    class NodeConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    PROTOCOL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    NODE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    protocol_versions: _containers.RepeatedScalarFieldContainer[int]
    node_name: str
    region: str
    node_config: _containers.MessageMap[str, Scalar]
    client_version: str
    proof: JoinProof
    def __init__(self, protocol_versions: _Optional[_Iterable[int]] = ..., node_name: _Optional[str] = ..., region: _Optional[str] = ..., node_config: _Optional[_Mapping[str, Scalar]] = ..., client_version: _Optional[str] = ..., proof: _Optional[_Union[JoinProof, _Mapping]] = ...) -> None: ...

class ChallengeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChallengeReply(_message.Message):
    __slots__ = ("nonce", "channel", "run_id", "run_name", "ttl_s")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    channel: str
    run_id: int
    run_name: str
    ttl_s: float
    def __init__(self, nonce: _Optional[bytes] = ..., channel: _Optional[str] = ..., run_id: _Optional[int] = ..., run_name: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class JoinProof(_message.Message):
    __slots__ = ("public_key", "nonce", "signature")
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    public_key: bytes
    nonce: bytes
    signature: bytes
    def __init__(self, public_key: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("protocol_version", "node_id", "session_token", "heartbeat_interval_s", "run_name", "run_id", "run_config", "max_chunk_bytes", "node_name")
    class RunConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    node_id: int
    session_token: str
    heartbeat_interval_s: float
    run_name: str
    run_id: int
    run_config: _containers.MessageMap[str, Scalar]
    max_chunk_bytes: int
    node_name: str
    def __init__(self, protocol_version: _Optional[int] = ..., node_id: _Optional[int] = ..., session_token: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., run_name: _Optional[str] = ..., run_id: _Optional[int] = ..., run_config: _Optional[_Mapping[str, Scalar]] = ..., max_chunk_bytes: _Optional[int] = ..., node_name: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("poll_timeout_s", "held_version", "has_model")
    POLL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAS_MODEL_FIELD_NUMBER: _ClassVar[int]
    poll_timeout_s: float
    held_version: int
    has_model: bool
    def __init__(self, poll_timeout_s: _Optional[float] = ..., held_version: _Optional[int] = ..., has_model: _Optional[bool] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("kind", "task_id", "run_id", "round", "model_version", "config", "deadline_unix_s", "num_tensors", "model_bytes", "reason", "upload", "flower", "secagg")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    MODEL_BYTES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_FIELD_NUMBER: _ClassVar[int]
    FLOWER_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    kind: TaskKind
    task_id: int
    run_id: int
    round: int
    model_version: int
    config: _containers.MessageMap[str, Scalar]
    deadline_unix_s: float
    num_tensors: int
    model_bytes: int
    reason: str
    upload: CompressionPlan
    flower: FlowerContent
    secagg: SecAggTask
    def __init__(self, kind: _Optional[_Union[TaskKind, str]] = ..., task_id: _Optional[int] = ..., run_id: _Optional[int] = ..., round: _Optional[int] = ..., model_version: _Optional[int] = ..., config: _Optional[_Mapping[str, Scalar]] = ..., deadline_unix_s: _Optional[float] = ..., num_tensors: _Optional[int] = ..., model_bytes: _Optional[int] = ..., reason: _Optional[str] = ..., upload: _Optional[_Union[CompressionPlan, _Mapping]] = ..., flower: _Optional[_Union[FlowerContent, _Mapping]] = ..., secagg: _Optional[_Union[SecAggTask, _Mapping]] = ...) -> None: ...

class SecAggSetup(_message.Message):
    __slots__ = ("cohort", "threshold", "degree", "graph_seed", "clip", "ring_bits", "max_examples", "low_rank", "low_rank_min_elements", "ddp")
    COHORT_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    GRAPH_SEED_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    RING_BITS_FIELD_NUMBER: _ClassVar[int]
    MAX_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOW_RANK_FIELD_NUMBER: _ClassVar[int]
    LOW_RANK_MIN_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    DDP_FIELD_NUMBER: _ClassVar[int]
    cohort: _containers.RepeatedScalarFieldContainer[int]
    threshold: int
    degree: int
    graph_seed: bytes
    clip: float
    ring_bits: int
    max_examples: int
    low_rank: int
    low_rank_min_elements: int
    ddp: DistributedDp
    def __init__(self, cohort: _Optional[_Iterable[int]] = ..., threshold: _Optional[int] = ..., degree: _Optional[int] = ..., graph_seed: _Optional[bytes] = ..., clip: _Optional[float] = ..., ring_bits: _Optional[int] = ..., max_examples: _Optional[int] = ..., low_rank: _Optional[int] = ..., low_rank_min_elements: _Optional[int] = ..., ddp: _Optional[_Union[DistributedDp, _Mapping]] = ...) -> None: ...

class DistributedDp(_message.Message):
    __slots__ = ("clip_norm", "granularity", "noise_stddev", "rounding_bound", "dimension", "rotation_seed", "min_survivors")
    CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    GRANULARITY_FIELD_NUMBER: _ClassVar[int]
    NOISE_STDDEV_FIELD_NUMBER: _ClassVar[int]
    ROUNDING_BOUND_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    ROTATION_SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    clip_norm: float
    granularity: float
    noise_stddev: float
    rounding_bound: float
    dimension: int
    rotation_seed: bytes
    min_survivors: int
    def __init__(self, clip_norm: _Optional[float] = ..., granularity: _Optional[float] = ..., noise_stddev: _Optional[float] = ..., rounding_bound: _Optional[float] = ..., dimension: _Optional[int] = ..., rotation_seed: _Optional[bytes] = ..., min_survivors: _Optional[int] = ...) -> None: ...

class PublicKeys(_message.Message):
    __slots__ = ("encrypt", "mask")
    ENCRYPT_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    encrypt: bytes
    mask: bytes
    def __init__(self, encrypt: _Optional[bytes] = ..., mask: _Optional[bytes] = ...) -> None: ...

class SecAggTask(_message.Message):
    __slots__ = ("setup", "roster", "inbox", "survivors", "dropped", "own", "keys_ahead")
    class RosterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: PublicKeys
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[PublicKeys, _Mapping]] = ...) -> None: ...
    class InboxEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    SETUP_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    INBOX_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    KEYS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    setup: SecAggSetup
    roster: _containers.MessageMap[int, PublicKeys]
    inbox: _containers.ScalarMap[int, bytes]
    survivors: _containers.RepeatedScalarFieldContainer[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    own: PublicKeys
    keys_ahead: bool
    def __init__(self, setup: _Optional[_Union[SecAggSetup, _Mapping]] = ..., roster: _Optional[_Mapping[int, PublicKeys]] = ..., inbox: _Optional[_Mapping[int, bytes]] = ..., survivors: _Optional[_Iterable[int]] = ..., dropped: _Optional[_Iterable[int]] = ..., own: _Optional[_Union[PublicKeys, _Mapping]] = ..., keys_ahead: _Optional[bool] = ...) -> None: ...

class SecAggResult(_message.Message):
    __slots__ = ("keys", "shares", "revealed")
    class SharesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    class RevealedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    REVEALED_FIELD_NUMBER: _ClassVar[int]
    keys: PublicKeys
    shares: _containers.ScalarMap[int, bytes]
    revealed: _containers.ScalarMap[int, bytes]
    def __init__(self, keys: _Optional[_Union[PublicKeys, _Mapping]] = ..., shares: _Optional[_Mapping[int, bytes]] = ..., revealed: _Optional[_Mapping[int, bytes]] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("task_id", "model_version", "base_version", "has_base")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAS_BASE_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    model_version: int
    base_version: int
    has_base: bool
    def __init__(self, task_id: _Optional[int] = ..., model_version: _Optional[int] = ..., base_version: _Optional[int] = ..., has_base: _Optional[bool] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("name", "dtype", "shape", "total_bytes", "offset", "data", "crc32", "first", "last", "encoding", "add_to_base")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    ADD_TO_BASE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    total_bytes: int
    offset: int
    data: bytes
    crc32: int
    first: bool
    last: bool
    encoding: Encoding
    add_to_base: bool
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32: _Optional[int] = ..., first: _Optional[bool] = ..., last: _Optional[bool] = ..., encoding: _Optional[_Union[Encoding, _Mapping]] = ..., add_to_base: _Optional[bool] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("task_id", "round", "attempt", "status", "update_kind", "num_examples", "metrics", "loss", "error", "num_tensors", "compute_s", "payload_bytes", "secagg", "flower", "trailer_follows")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Scalar
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Scalar, _Mapping]] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECAGG_FIELD_NUMBER: _ClassVar[int]
    FLOWER_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    round: int
    attempt: int
    status: ResultStatus
    update_kind: UpdateKind
    num_examples: int
    metrics: _containers.MessageMap[str, Scalar]
    loss: float
    error: str
    num_tensors: int
    compute_s: float
    payload_bytes: int
    secagg: SecAggResult
    flower: FlowerContent
    trailer_follows: bool
    def __init__(self, task_id: _Optional[int] = ..., round: _Optional[int] = ..., attempt: _Optional[int] = ..., status: _Optional[_Union[ResultStatus, str]] = ..., update_kind: _Optional[_Union[UpdateKind, str]] = ..., num_examples: _Optional[int] = ..., metrics: _Optional[_Mapping[str, Scalar]] = ..., loss: _Optional[float] = ..., error: _Optional[str] = ..., num_tensors: _Optional[int] = ..., compute_s: _Optional[float] = ..., payload_bytes: _Optional[int] = ..., secagg: _Optional[_Union[SecAggResult, _Mapping]] = ..., flower: _Optional[_Union[FlowerContent, _Mapping]] = ..., trailer_follows: _Optional[bool] = ...) -> None: ...

class FlowerContent(_message.Message):
    __slots__ = ("message_type", "group_id", "records", "array_records", "record_order", "error")
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_RECORDS_FIELD_NUMBER: _ClassVar[int]
    RECORD_ORDER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    message_type: str
    group_id: str
    records: bytes
    array_records: _containers.RepeatedCompositeFieldContainer[FlowerArrayRecord]
    record_order: _containers.RepeatedScalarFieldContainer[str]
    error: FlowerError
    def __init__(self, message_type: _Optional[str] = ..., group_id: _Optional[str] = ..., records: _Optional[bytes] = ..., array_records: _Optional[_Iterable[_Union[FlowerArrayRecord, _Mapping]]] = ..., record_order: _Optional[_Iterable[str]] = ..., error: _Optional[_Union[FlowerError, _Mapping]] = ...) -> None: ...

class FlowerArrayRecord(_message.Message):
    __slots__ = ("key", "array_keys")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ARRAY_KEYS_FIELD_NUMBER: _ClassVar[int]
    key: str
    array_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., array_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class FlowerError(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class UploadMessage(_message.Message):
    __slots__ = ("header", "chunk", "trailer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    chunk: TensorChunk
    trailer: UploadHeader
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ..., trailer: _Optional[_Union[UploadHeader, _Mapping]] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("accepted", "error_code", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    error_code: str
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., error_code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
