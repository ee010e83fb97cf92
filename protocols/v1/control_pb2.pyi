from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdminChallengeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdminChallengeReply(_message.Message):
    __slots__ = ("nonce", "channel", "ttl_s")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    channel: str
    ttl_s: float
    def __init__(self, nonce: _Optional[bytes] = ..., channel: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class AdminLoginRequest(_message.Message):
    __slots__ = ("public_key", "nonce", "signature")
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    public_key: bytes
    nonce: bytes
    signature: bytes
    def __init__(self, public_key: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class AdminLoginReply(_message.Message):
    __slots__ = ("token", "admin", "ttl_s")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    token: str
    admin: str
    ttl_s: float
    def __init__(self, token: _Optional[str] = ..., admin: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShowRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    def __init__(self, run_id: _Optional[int] = ...) -> None: ...

class JsonReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    reason: str
    def __init__(self, run_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class StopRunReply(_message.Message):
    __slots__ = ("first_request", "status")
    FIRST_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    first_request: bool
    status: str
    def __init__(self, first_request: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("run_id", "after_id", "follow")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    after_id: int
    follow: bool
    def __init__(self, run_id: _Optional[int] = ..., after_id: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("id", "run_id", "round", "kind", "message", "data_json", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    run_id: int
    round: int
    kind: str
    message: str
    data_json: str
    created_at: str
    def __init__(self, id: _Optional[int] = ..., run_id: _Optional[int] = ..., round: _Optional[int] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., data_json: _Optional[str] = ..., created_at: _Optional[str] = ...) -> None: ...

class PullModelRequest(_message.Message):
    __slots__ = ("run_id", "round")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    round: int
    def __init__(self, run_id: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: ModelHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[ModelHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ModelHeader(_message.Message):
    __slots__ = ("round", "size_bytes", "sha256", "num_tensors")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    round: int
    size_bytes: int
    sha256: str
    num_tensors: int
    def __init__(self, round: _Optional[int] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., num_tensors: _Optional[int] = ...) -> None: ...

class DashboardLinkRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DashboardLinkReply(_message.Message):
    __slots__ = ("token", "ttl_s", "url")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    token: str
    ttl_s: float
    url: str
    def __init__(self, token: _Optional[str] = ..., ttl_s: _Optional[float] = ..., url: _Optional[str] = ...) -> None: ...
