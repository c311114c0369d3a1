from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SpecType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPEC_TYPE_UNSPECIFIED: _ClassVar[SpecType]
    SPEC_TYPE_BOOL: _ClassVar[SpecType]
    SPEC_TYPE_INT: _ClassVar[SpecType]
    SPEC_TYPE_DOUBLE: _ClassVar[SpecType]
    SPEC_TYPE_STRING: _ClassVar[SpecType]
    SPEC_TYPE_BYTES: _ClassVar[SpecType]

class Dialect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIALECT_UNSPECIFIED: _ClassVar[Dialect]
    DIALECT_ATEN: _ClassVar[Dialect]
    DIALECT_EDGE: _ClassVar[Dialect]

class Hook(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOOK_UNSPECIFIED: _ClassVar[Hook]
    HOOK_PARTITION: _ClassVar[Hook]
    HOOK_OPS_TO_NOT_DECOMPOSE: _ClassVar[Hook]
    HOOK_TRANSFORM_FOR_PRE_DECOMPOSITION: _ClassVar[Hook]

class RejectionSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECTION_SOURCE_UNSPECIFIED: _ClassVar[RejectionSource]
    REJECTION_SOURCE_PARTITIONER: _ClassVar[RejectionSource]
    REJECTION_SOURCE_BACKEND_LOG: _ClassVar[RejectionSource]
    REJECTION_SOURCE_DERIVED: _ClassVar[RejectionSource]

class QuantizeSteps(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUANTIZE_STEPS_UNSPECIFIED: _ClassVar[QuantizeSteps]
    QUANTIZE_STEPS_ALL: _ClassVar[QuantizeSteps]
    QUANTIZE_STEPS_ANNOTATE: _ClassVar[QuantizeSteps]

class QuantizeStep(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUANTIZE_STEP_UNSPECIFIED: _ClassVar[QuantizeStep]
    QUANTIZE_STEP_TRANSFORM: _ClassVar[QuantizeStep]
    QUANTIZE_STEP_ANNOTATE: _ClassVar[QuantizeStep]
    QUANTIZE_STEP_VALIDATE: _ClassVar[QuantizeStep]
SPEC_TYPE_UNSPECIFIED: SpecType
SPEC_TYPE_BOOL: SpecType
SPEC_TYPE_INT: SpecType
SPEC_TYPE_DOUBLE: SpecType
SPEC_TYPE_STRING: SpecType
SPEC_TYPE_BYTES: SpecType
DIALECT_UNSPECIFIED: Dialect
DIALECT_ATEN: Dialect
DIALECT_EDGE: Dialect
HOOK_UNSPECIFIED: Hook
HOOK_PARTITION: Hook
HOOK_OPS_TO_NOT_DECOMPOSE: Hook
HOOK_TRANSFORM_FOR_PRE_DECOMPOSITION: Hook
REJECTION_SOURCE_UNSPECIFIED: RejectionSource
REJECTION_SOURCE_PARTITIONER: RejectionSource
REJECTION_SOURCE_BACKEND_LOG: RejectionSource
REJECTION_SOURCE_DERIVED: RejectionSource
QUANTIZE_STEPS_UNSPECIFIED: QuantizeSteps
QUANTIZE_STEPS_ALL: QuantizeSteps
QUANTIZE_STEPS_ANNOTATE: QuantizeSteps
QUANTIZE_STEP_UNSPECIFIED: QuantizeStep
QUANTIZE_STEP_TRANSFORM: QuantizeStep
QUANTIZE_STEP_ANNOTATE: QuantizeStep
QUANTIZE_STEP_VALIDATE: QuantizeStep

class Digest(_message.Message):
    __slots__ = ("hash", "size_bytes")
    HASH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    hash: str
    size_bytes: int
    def __init__(self, hash: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class SpecValue(_message.Message):
    __slots__ = ("bool_value", "int_value", "double_value", "string_value", "bytes_value")
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    bool_value: bool
    int_value: int
    double_value: float
    string_value: str
    bytes_value: bytes
    def __init__(self, bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ...) -> None: ...

class PartitionerRef(_message.Message):
    __slots__ = ("name", "spec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: _containers.RepeatedCompositeFieldContainer[SpecEntry]
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Iterable[_Union[SpecEntry, _Mapping]]] = ...) -> None: ...

class SpecEntry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: SpecValue
    def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SpecValue, _Mapping]] = ...) -> None: ...

class CompileSpec(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class DelegationSpec(_message.Message):
    __slots__ = ("backend_id", "compile_specs")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SPECS_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    compile_specs: _containers.RepeatedCompositeFieldContainer[CompileSpec]
    def __init__(self, backend_id: _Optional[str] = ..., compile_specs: _Optional[_Iterable[_Union[CompileSpec, _Mapping]]] = ...) -> None: ...

class TensorRef(_message.Message):
    __slots__ = ("name", "dtype", "sizes", "strides", "storage_offset", "storage", "fake", "is_parameter", "requires_grad", "withheld", "withheld_storage", "withheld_storage_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    FAKE_FIELD_NUMBER: _ClassVar[int]
    IS_PARAMETER_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_STORAGE_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    sizes: _containers.RepeatedScalarFieldContainer[int]
    strides: _containers.RepeatedScalarFieldContainer[int]
    storage_offset: int
    storage: Digest
    fake: bool
    is_parameter: bool
    requires_grad: bool
    withheld: bool
    withheld_storage: int
    withheld_storage_bytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., sizes: _Optional[_Iterable[int]] = ..., strides: _Optional[_Iterable[int]] = ..., storage_offset: _Optional[int] = ..., storage: _Optional[_Union[Digest, _Mapping]] = ..., fake: _Optional[bool] = ..., is_parameter: _Optional[bool] = ..., requires_grad: _Optional[bool] = ..., withheld: _Optional[bool] = ..., withheld_storage: _Optional[int] = ..., withheld_storage_bytes: _Optional[int] = ...) -> None: ...

class ModuleTensor(_message.Message):
    __slots__ = ("module_path", "tensor")
    MODULE_PATH_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    module_path: str
    tensor: TensorRef
    def __init__(self, module_path: _Optional[str] = ..., tensor: _Optional[_Union[TensorRef, _Mapping]] = ...) -> None: ...

class LoweredModule(_message.Message):
    __slots__ = ("module_path", "name", "backend_id", "compile_specs", "original_program", "original_withheld")
    MODULE_PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SPECS_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_PROGRAM_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    module_path: str
    name: str
    backend_id: str
    compile_specs: _containers.RepeatedCompositeFieldContainer[CompileSpec]
    original_program: Program
    original_withheld: bool
    def __init__(self, module_path: _Optional[str] = ..., name: _Optional[str] = ..., backend_id: _Optional[str] = ..., compile_specs: _Optional[_Iterable[_Union[CompileSpec, _Mapping]]] = ..., original_program: _Optional[_Union[Program, _Mapping]] = ..., original_withheld: _Optional[bool] = ...) -> None: ...

class NodeFingerprint(_message.Message):
    __slots__ = ("graph", "name", "op", "target", "num_args", "kwarg_names", "args")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    NUM_ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARG_NAMES_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    graph: str
    name: str
    op: str
    target: str
    num_args: int
    kwarg_names: _containers.RepeatedScalarFieldContainer[str]
    args: str
    def __init__(self, graph: _Optional[str] = ..., name: _Optional[str] = ..., op: _Optional[str] = ..., target: _Optional[str] = ..., num_args: _Optional[int] = ..., kwarg_names: _Optional[_Iterable[str]] = ..., args: _Optional[str] = ...) -> None: ...

class NodeMetadata(_message.Message):
    __slots__ = ("node", "entries", "has_tensor_meta", "tensor_meta_requires_grad", "no_val", "tensor_meta_is_none", "tensor_meta_none_items", "val_is_list")
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HAS_TENSOR_META_FIELD_NUMBER: _ClassVar[int]
    TENSOR_META_REQUIRES_GRAD_FIELD_NUMBER: _ClassVar[int]
    NO_VAL_FIELD_NUMBER: _ClassVar[int]
    TENSOR_META_IS_NONE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_META_NONE_ITEMS_FIELD_NUMBER: _ClassVar[int]
    VAL_IS_LIST_FIELD_NUMBER: _ClassVar[int]
    node: NodeRef
    entries: _containers.ScalarMap[str, str]
    has_tensor_meta: bool
    tensor_meta_requires_grad: bool
    no_val: bool
    tensor_meta_is_none: bool
    tensor_meta_none_items: _containers.RepeatedScalarFieldContainer[bool]
    val_is_list: bool
    def __init__(self, node: _Optional[_Union[NodeRef, _Mapping]] = ..., entries: _Optional[_Mapping[str, str]] = ..., has_tensor_meta: _Optional[bool] = ..., tensor_meta_requires_grad: _Optional[bool] = ..., no_val: _Optional[bool] = ..., tensor_meta_is_none: _Optional[bool] = ..., tensor_meta_none_items: _Optional[_Iterable[bool]] = ..., val_is_list: _Optional[bool] = ...) -> None: ...

class Program(_message.Message):
    __slots__ = ("dialect", "graph", "state_dict", "constants", "module_tensors", "lowered_modules", "fingerprint", "node_metadata", "edge_verifier")
    DIALECT_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    STATE_DICT_FIELD_NUMBER: _ClassVar[int]
    CONSTANTS_FIELD_NUMBER: _ClassVar[int]
    MODULE_TENSORS_FIELD_NUMBER: _ClassVar[int]
    LOWERED_MODULES_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NODE_METADATA_FIELD_NUMBER: _ClassVar[int]
    EDGE_VERIFIER_FIELD_NUMBER: _ClassVar[int]
    dialect: Dialect
    graph: Digest
    state_dict: _containers.RepeatedCompositeFieldContainer[TensorRef]
    constants: _containers.RepeatedCompositeFieldContainer[TensorRef]
    module_tensors: _containers.RepeatedCompositeFieldContainer[ModuleTensor]
    lowered_modules: _containers.RepeatedCompositeFieldContainer[LoweredModule]
    fingerprint: _containers.RepeatedCompositeFieldContainer[NodeFingerprint]
    node_metadata: _containers.RepeatedCompositeFieldContainer[NodeMetadata]
    edge_verifier: EdgeVerifier
    def __init__(self, dialect: _Optional[_Union[Dialect, str]] = ..., graph: _Optional[_Union[Digest, _Mapping]] = ..., state_dict: _Optional[_Iterable[_Union[TensorRef, _Mapping]]] = ..., constants: _Optional[_Iterable[_Union[TensorRef, _Mapping]]] = ..., module_tensors: _Optional[_Iterable[_Union[ModuleTensor, _Mapping]]] = ..., lowered_modules: _Optional[_Iterable[_Union[LoweredModule, _Mapping]]] = ..., fingerprint: _Optional[_Iterable[_Union[NodeFingerprint, _Mapping]]] = ..., node_metadata: _Optional[_Iterable[_Union[NodeMetadata, _Mapping]]] = ..., edge_verifier: _Optional[_Union[EdgeVerifier, _Mapping]] = ...) -> None: ...

class EdgeVerifier(_message.Message):
    __slots__ = ("check_ir_validity", "use_dim_order", "core_aten_ops_exception_list", "preserve_ops")
    CHECK_IR_VALIDITY_FIELD_NUMBER: _ClassVar[int]
    USE_DIM_ORDER_FIELD_NUMBER: _ClassVar[int]
    CORE_ATEN_OPS_EXCEPTION_LIST_FIELD_NUMBER: _ClassVar[int]
    PRESERVE_OPS_FIELD_NUMBER: _ClassVar[int]
    check_ir_validity: bool
    use_dim_order: bool
    core_aten_ops_exception_list: _containers.RepeatedScalarFieldContainer[str]
    preserve_ops: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, check_ir_validity: _Optional[bool] = ..., use_dim_order: _Optional[bool] = ..., core_aten_ops_exception_list: _Optional[_Iterable[str]] = ..., preserve_ops: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRef(_message.Message):
    __slots__ = ("graph", "name")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    graph: str
    name: str
    def __init__(self, graph: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class MetaValue(_message.Message):
    __slots__ = ("none_value", "bool_value", "int_value", "double_value", "string_value", "bytes_value", "list_value", "tuple_value", "map_value")
    NONE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BYTES_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    TUPLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    none_value: bool
    bool_value: bool
    int_value: int
    double_value: float
    string_value: str
    bytes_value: bytes
    list_value: MetaList
    tuple_value: MetaList
    map_value: MetaMap
    def __init__(self, none_value: _Optional[bool] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bytes_value: _Optional[bytes] = ..., list_value: _Optional[_Union[MetaList, _Mapping]] = ..., tuple_value: _Optional[_Union[MetaList, _Mapping]] = ..., map_value: _Optional[_Union[MetaMap, _Mapping]] = ...) -> None: ...

class MetaList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[MetaValue]
    def __init__(self, items: _Optional[_Iterable[_Union[MetaValue, _Mapping]]] = ...) -> None: ...

class MetaMap(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetaValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetaValue, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.MessageMap[str, MetaValue]
    def __init__(self, entries: _Optional[_Mapping[str, MetaValue]] = ...) -> None: ...

class MetaUpdate(_message.Message):
    __slots__ = ("node", "key", "value", "removed")
    NODE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    node: NodeRef
    key: str
    value: MetaValue
    removed: bool
    def __init__(self, node: _Optional[_Union[NodeRef, _Mapping]] = ..., key: _Optional[str] = ..., value: _Optional[_Union[MetaValue, _Mapping]] = ..., removed: _Optional[bool] = ...) -> None: ...

class NodeTag(_message.Message):
    __slots__ = ("node", "tag")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    node: NodeRef
    tag: str
    def __init__(self, node: _Optional[_Union[NodeRef, _Mapping]] = ..., tag: _Optional[str] = ...) -> None: ...

class RemoteException(_message.Message):
    __slots__ = ("type", "message", "traceback", "without_arguments")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    traceback: str
    without_arguments: bool
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ..., without_arguments: _Optional[bool] = ...) -> None: ...

class ListPartitionersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpecKeyInfo(_message.Message):
    __slots__ = ("name", "type", "default", "doc")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: SpecType
    default: SpecValue
    doc: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[SpecType, str]] = ..., default: _Optional[_Union[SpecValue, _Mapping]] = ..., doc: _Optional[str] = ...) -> None: ...

class PartitionerInfo(_message.Message):
    __slots__ = ("name", "backend_id", "spec_keys", "overridden_hooks", "class_name", "description", "backend_module", "environment")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_KEYS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDDEN_HOOKS_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_MODULE_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    backend_id: str
    spec_keys: _containers.RepeatedCompositeFieldContainer[SpecKeyInfo]
    overridden_hooks: _containers.RepeatedScalarFieldContainer[Hook]
    class_name: str
    description: str
    backend_module: str
    environment: str
    def __init__(self, name: _Optional[str] = ..., backend_id: _Optional[str] = ..., spec_keys: _Optional[_Iterable[_Union[SpecKeyInfo, _Mapping]]] = ..., overridden_hooks: _Optional[_Iterable[_Union[Hook, str]]] = ..., class_name: _Optional[str] = ..., description: _Optional[str] = ..., backend_module: _Optional[str] = ..., environment: _Optional[str] = ...) -> None: ...

class ServerVersions(_message.Message):
    __slots__ = ("torch", "executorch", "export_schema", "api", "server", "torchao", "python_hash_seed")
    TORCH_FIELD_NUMBER: _ClassVar[int]
    EXECUTORCH_FIELD_NUMBER: _ClassVar[int]
    EXPORT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    TORCHAO_FIELD_NUMBER: _ClassVar[int]
    PYTHON_HASH_SEED_FIELD_NUMBER: _ClassVar[int]
    torch: str
    executorch: str
    export_schema: str
    api: str
    server: str
    torchao: str
    python_hash_seed: str
    def __init__(self, torch: _Optional[str] = ..., executorch: _Optional[str] = ..., export_schema: _Optional[str] = ..., api: _Optional[str] = ..., server: _Optional[str] = ..., torchao: _Optional[str] = ..., python_hash_seed: _Optional[str] = ...) -> None: ...

class ListPartitionersResponse(_message.Message):
    __slots__ = ("partitioners", "versions", "backends", "accepts_withheld_tensors", "quantizers", "environment", "environments", "accepts_withheld_lowered_programs")
    PARTITIONERS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_WITHHELD_TENSORS_FIELD_NUMBER: _ClassVar[int]
    QUANTIZERS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_WITHHELD_LOWERED_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    partitioners: _containers.RepeatedCompositeFieldContainer[PartitionerInfo]
    versions: ServerVersions
    backends: _containers.RepeatedCompositeFieldContainer[BackendInfo]
    accepts_withheld_tensors: bool
    quantizers: _containers.RepeatedCompositeFieldContainer[QuantizerInfo]
    environment: str
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]
    accepts_withheld_lowered_programs: bool
    def __init__(self, partitioners: _Optional[_Iterable[_Union[PartitionerInfo, _Mapping]]] = ..., versions: _Optional[_Union[ServerVersions, _Mapping]] = ..., backends: _Optional[_Iterable[_Union[BackendInfo, _Mapping]]] = ..., accepts_withheld_tensors: _Optional[bool] = ..., quantizers: _Optional[_Iterable[_Union[QuantizerInfo, _Mapping]]] = ..., environment: _Optional[str] = ..., environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]] = ..., accepts_withheld_lowered_programs: _Optional[bool] = ...) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("name", "versions", "accepts_withheld_tensors", "error", "accepts_withheld_lowered_programs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_WITHHELD_TENSORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_WITHHELD_LOWERED_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    versions: ServerVersions
    accepts_withheld_tensors: bool
    error: str
    accepts_withheld_lowered_programs: bool
    def __init__(self, name: _Optional[str] = ..., versions: _Optional[_Union[ServerVersions, _Mapping]] = ..., accepts_withheld_tensors: _Optional[bool] = ..., error: _Optional[str] = ..., accepts_withheld_lowered_programs: _Optional[bool] = ...) -> None: ...

class FindMissingBlobsRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedCompositeFieldContainer[Digest]
    def __init__(self, digests: _Optional[_Iterable[_Union[Digest, _Mapping]]] = ...) -> None: ...

class FindMissingBlobsResponse(_message.Message):
    __slots__ = ("missing_digests",)
    MISSING_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    missing_digests: _containers.RepeatedCompositeFieldContainer[Digest]
    def __init__(self, missing_digests: _Optional[_Iterable[_Union[Digest, _Mapping]]] = ...) -> None: ...

class UploadBlobsRequest(_message.Message):
    __slots__ = ("digest", "offset", "data")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    digest: Digest
    offset: int
    data: bytes
    def __init__(self, digest: _Optional[_Union[Digest, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadBlobsResponse(_message.Message):
    __slots__ = ("committed_digests",)
    COMMITTED_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    committed_digests: _containers.RepeatedCompositeFieldContainer[Digest]
    def __init__(self, committed_digests: _Optional[_Iterable[_Union[Digest, _Mapping]]] = ...) -> None: ...

class ReadBlobsRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedCompositeFieldContainer[Digest]
    def __init__(self, digests: _Optional[_Iterable[_Union[Digest, _Mapping]]] = ...) -> None: ...

class ReadBlobsResponse(_message.Message):
    __slots__ = ("digest", "offset", "data")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    digest: Digest
    offset: int
    data: bytes
    def __init__(self, digest: _Optional[_Union[Digest, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PartitionRequest(_message.Message):
    __slots__ = ("partitioner", "program", "program_digest", "rng_state")
    PARTITIONER_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    partitioner: PartitionerRef
    program: Program
    program_digest: Digest
    rng_state: bytes
    def __init__(self, partitioner: _Optional[_Union[PartitionerRef, _Mapping]] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., program_digest: _Optional[_Union[Digest, _Mapping]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class PartitionResponse(_message.Message):
    __slots__ = ("tags", "partition_tags", "meta_updates", "rng_state", "rejections")
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_TAGS_FIELD_NUMBER: _ClassVar[int]
    META_UPDATES_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedCompositeFieldContainer[NodeTag]
    partition_tags: _containers.RepeatedCompositeFieldContainer[PartitionTag]
    meta_updates: _containers.RepeatedCompositeFieldContainer[MetaUpdate]
    rng_state: bytes
    rejections: _containers.RepeatedCompositeFieldContainer[NodeRejection]
    def __init__(self, tags: _Optional[_Iterable[_Union[NodeTag, _Mapping]]] = ..., partition_tags: _Optional[_Iterable[_Union[PartitionTag, _Mapping]]] = ..., meta_updates: _Optional[_Iterable[_Union[MetaUpdate, _Mapping]]] = ..., rng_state: _Optional[bytes] = ..., rejections: _Optional[_Iterable[_Union[NodeRejection, _Mapping]]] = ...) -> None: ...

class PartitionTag(_message.Message):
    __slots__ = ("tag", "delegation_spec")
    TAG_FIELD_NUMBER: _ClassVar[int]
    DELEGATION_SPEC_FIELD_NUMBER: _ClassVar[int]
    tag: str
    delegation_spec: DelegationSpec
    def __init__(self, tag: _Optional[str] = ..., delegation_spec: _Optional[_Union[DelegationSpec, _Mapping]] = ...) -> None: ...

class OpsToNotDecomposeRequest(_message.Message):
    __slots__ = ("partitioner", "program", "program_digest", "rng_state")
    PARTITIONER_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    partitioner: PartitionerRef
    program: Program
    program_digest: Digest
    rng_state: bytes
    def __init__(self, partitioner: _Optional[_Union[PartitionerRef, _Mapping]] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., program_digest: _Optional[_Union[Digest, _Mapping]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class NodeFailure(_message.Message):
    __slots__ = ("node", "exception")
    NODE_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_FIELD_NUMBER: _ClassVar[int]
    node: NodeRef
    exception: RemoteException
    def __init__(self, node: _Optional[_Union[NodeRef, _Mapping]] = ..., exception: _Optional[_Union[RemoteException, _Mapping]] = ...) -> None: ...

class OpsToNotDecomposeResponse(_message.Message):
    __slots__ = ("ops", "has_filter", "supported", "failures", "rng_state")
    OPS_FIELD_NUMBER: _ClassVar[int]
    HAS_FILTER_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedScalarFieldContainer[str]
    has_filter: bool
    supported: _containers.RepeatedCompositeFieldContainer[NodeRef]
    failures: _containers.RepeatedCompositeFieldContainer[NodeFailure]
    rng_state: bytes
    def __init__(self, ops: _Optional[_Iterable[str]] = ..., has_filter: _Optional[bool] = ..., supported: _Optional[_Iterable[_Union[NodeRef, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[NodeFailure, _Mapping]]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class TransformForPreDecompositionRequest(_message.Message):
    __slots__ = ("partitioner", "program", "program_digest", "rng_state")
    PARTITIONER_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    partitioner: PartitionerRef
    program: Program
    program_digest: Digest
    rng_state: bytes
    def __init__(self, partitioner: _Optional[_Union[PartitionerRef, _Mapping]] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., program_digest: _Optional[_Union[Digest, _Mapping]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class TransformForPreDecompositionResponse(_message.Message):
    __slots__ = ("unchanged", "program", "rng_state")
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    unchanged: bool
    program: Program
    rng_state: bytes
    def __init__(self, unchanged: _Optional[bool] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class LowerRequest(_message.Message):
    __slots__ = ("archive", "partitioners", "options", "held_pte")
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONERS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_PTE_FIELD_NUMBER: _ClassVar[int]
    archive: Digest
    partitioners: _containers.RepeatedCompositeFieldContainer[PartitionerRef]
    options: LowerOptions
    held_pte: Digest
    def __init__(self, archive: _Optional[_Union[Digest, _Mapping]] = ..., partitioners: _Optional[_Iterable[_Union[PartitionerRef, _Mapping]]] = ..., options: _Optional[_Union[LowerOptions, _Mapping]] = ..., held_pte: _Optional[_Union[Digest, _Mapping]] = ...) -> None: ...

class LowerOptions(_message.Message):
    __slots__ = ("skip_ir_validity_check", "report_only")
    SKIP_IR_VALIDITY_CHECK_FIELD_NUMBER: _ClassVar[int]
    REPORT_ONLY_FIELD_NUMBER: _ClassVar[int]
    skip_ir_validity_check: bool
    report_only: bool
    def __init__(self, skip_ir_validity_check: _Optional[bool] = ..., report_only: _Optional[bool] = ...) -> None: ...

class BackendDelegation(_message.Message):
    __slots__ = ("backend_id", "partitions", "nodes")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    partitions: int
    nodes: int
    def __init__(self, backend_id: _Optional[str] = ..., partitions: _Optional[int] = ..., nodes: _Optional[int] = ...) -> None: ...

class OperatorCount(_message.Message):
    __slots__ = ("op", "count")
    OP_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    op: str
    count: int
    def __init__(self, op: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class MethodReport(_message.Message):
    __slots__ = ("method", "total_nodes", "delegated", "cpu_ops", "nodes", "partitions")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NODES_FIELD_NUMBER: _ClassVar[int]
    DELEGATED_FIELD_NUMBER: _ClassVar[int]
    CPU_OPS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    method: str
    total_nodes: int
    delegated: _containers.RepeatedCompositeFieldContainer[BackendDelegation]
    cpu_ops: _containers.RepeatedCompositeFieldContainer[OperatorCount]
    nodes: _containers.RepeatedCompositeFieldContainer[ReportNode]
    partitions: _containers.RepeatedCompositeFieldContainer[ReportPartition]
    def __init__(self, method: _Optional[str] = ..., total_nodes: _Optional[int] = ..., delegated: _Optional[_Iterable[_Union[BackendDelegation, _Mapping]]] = ..., cpu_ops: _Optional[_Iterable[_Union[OperatorCount, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[ReportNode, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[ReportPartition, _Mapping]]] = ...) -> None: ...

class DelegationReport(_message.Message):
    __slots__ = ("methods",)
    METHODS_FIELD_NUMBER: _ClassVar[int]
    methods: _containers.RepeatedCompositeFieldContainer[MethodReport]
    def __init__(self, methods: _Optional[_Iterable[_Union[MethodReport, _Mapping]]] = ...) -> None: ...

class LowerResponse(_message.Message):
    __slots__ = ("report", "pte", "offset", "data")
    REPORT_FIELD_NUMBER: _ClassVar[int]
    PTE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    report: DelegationReport
    pte: Digest
    offset: int
    data: bytes
    def __init__(self, report: _Optional[_Union[DelegationReport, _Mapping]] = ..., pte: _Optional[_Union[Digest, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class NodeRejection(_message.Message):
    __slots__ = ("node", "target", "reason", "source")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    node: NodeRef
    target: str
    reason: str
    source: RejectionSource
    def __init__(self, node: _Optional[_Union[NodeRef, _Mapping]] = ..., target: _Optional[str] = ..., reason: _Optional[str] = ..., source: _Optional[_Union[RejectionSource, str]] = ...) -> None: ...

class ModuleScope(_message.Message):
    __slots__ = ("path", "type")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    path: str
    type: str
    def __init__(self, path: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class ReportNode(_message.Message):
    __slots__ = ("name", "op", "kind", "inputs", "backend_id", "partition", "shapes", "stack_trace", "module_stack", "reason", "reason_source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    STACK_TRACE_FIELD_NUMBER: _ClassVar[int]
    MODULE_STACK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    kind: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    backend_id: str
    partition: str
    shapes: str
    stack_trace: str
    module_stack: _containers.RepeatedCompositeFieldContainer[ModuleScope]
    reason: str
    reason_source: RejectionSource
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., kind: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., backend_id: _Optional[str] = ..., partition: _Optional[str] = ..., shapes: _Optional[str] = ..., stack_trace: _Optional[str] = ..., module_stack: _Optional[_Iterable[_Union[ModuleScope, _Mapping]]] = ..., reason: _Optional[str] = ..., reason_source: _Optional[_Union[RejectionSource, str]] = ...) -> None: ...

class ReportPartition(_message.Message):
    __slots__ = ("id", "backend_id", "nodes")
    ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    id: str
    backend_id: str
    nodes: int
    def __init__(self, id: _Optional[str] = ..., backend_id: _Optional[str] = ..., nodes: _Optional[int] = ...) -> None: ...

class BackendInfo(_message.Message):
    __slots__ = ("backend_id", "description", "module", "environment")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MODULE_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    description: str
    module: str
    environment: str
    def __init__(self, backend_id: _Optional[str] = ..., description: _Optional[str] = ..., module: _Optional[str] = ..., environment: _Optional[str] = ...) -> None: ...

class PreprocessRequest(_message.Message):
    __slots__ = ("backend_id", "multimethod", "methods", "rng_state")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    MULTIMETHOD_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    multimethod: bool
    methods: _containers.RepeatedCompositeFieldContainer[PreprocessMethod]
    rng_state: bytes
    def __init__(self, backend_id: _Optional[str] = ..., multimethod: _Optional[bool] = ..., methods: _Optional[_Iterable[_Union[PreprocessMethod, _Mapping]]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class PreprocessMethod(_message.Message):
    __slots__ = ("name", "programs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    programs: _containers.RepeatedCompositeFieldContainer[PreprocessInput]
    def __init__(self, name: _Optional[str] = ..., programs: _Optional[_Iterable[_Union[PreprocessInput, _Mapping]]] = ...) -> None: ...

class PreprocessInput(_message.Message):
    __slots__ = ("program_digest", "compile_specs", "node_meta")
    PROGRAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    COMPILE_SPECS_FIELD_NUMBER: _ClassVar[int]
    NODE_META_FIELD_NUMBER: _ClassVar[int]
    program_digest: Digest
    compile_specs: _containers.RepeatedCompositeFieldContainer[CompileSpec]
    node_meta: _containers.RepeatedCompositeFieldContainer[MetaUpdate]
    def __init__(self, program_digest: _Optional[_Union[Digest, _Mapping]] = ..., compile_specs: _Optional[_Iterable[_Union[CompileSpec, _Mapping]]] = ..., node_meta: _Optional[_Iterable[_Union[MetaUpdate, _Mapping]]] = ...) -> None: ...

class PreprocessResponse(_message.Message):
    __slots__ = ("methods", "rng_state")
    METHODS_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    methods: _containers.RepeatedCompositeFieldContainer[PreprocessMethodResult]
    rng_state: bytes
    def __init__(self, methods: _Optional[_Iterable[_Union[PreprocessMethodResult, _Mapping]]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class PreprocessMethodResult(_message.Message):
    __slots__ = ("name", "results")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    results: _containers.RepeatedCompositeFieldContainer[PreprocessOutput]
    def __init__(self, name: _Optional[str] = ..., results: _Optional[_Iterable[_Union[PreprocessOutput, _Mapping]]] = ...) -> None: ...

class PreprocessOutput(_message.Message):
    __slots__ = ("processed_bytes", "processed_inline", "has_debug_handle_map", "debug_handle_map", "data_store_output", "delegate_info_meta")
    PROCESSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_INLINE_FIELD_NUMBER: _ClassVar[int]
    HAS_DEBUG_HANDLE_MAP_FIELD_NUMBER: _ClassVar[int]
    DEBUG_HANDLE_MAP_FIELD_NUMBER: _ClassVar[int]
    DATA_STORE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    DELEGATE_INFO_META_FIELD_NUMBER: _ClassVar[int]
    processed_bytes: Digest
    processed_inline: bytes
    has_debug_handle_map: bool
    debug_handle_map: _containers.RepeatedCompositeFieldContainer[DebugHandleEntry]
    data_store_output: NamedDataOutput
    delegate_info_meta: MetaValue
    def __init__(self, processed_bytes: _Optional[_Union[Digest, _Mapping]] = ..., processed_inline: _Optional[bytes] = ..., has_debug_handle_map: _Optional[bool] = ..., debug_handle_map: _Optional[_Iterable[_Union[DebugHandleEntry, _Mapping]]] = ..., data_store_output: _Optional[_Union[NamedDataOutput, _Mapping]] = ..., delegate_info_meta: _Optional[_Union[MetaValue, _Mapping]] = ...) -> None: ...

class DebugHandleEntry(_message.Message):
    __slots__ = ("int_key", "str_key", "handles")
    INT_KEY_FIELD_NUMBER: _ClassVar[int]
    STR_KEY_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    int_key: int
    str_key: str
    handles: MetaValue
    def __init__(self, int_key: _Optional[int] = ..., str_key: _Optional[str] = ..., handles: _Optional[_Union[MetaValue, _Mapping]] = ...) -> None: ...

class NamedDataOutput(_message.Message):
    __slots__ = ("buffers", "pte_data", "external_data")
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    PTE_DATA_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_DATA_FIELD_NUMBER: _ClassVar[int]
    buffers: _containers.RepeatedCompositeFieldContainer[Digest]
    pte_data: _containers.RepeatedCompositeFieldContainer[NamedDataEntry]
    external_data: _containers.RepeatedCompositeFieldContainer[ExternalNamedData]
    def __init__(self, buffers: _Optional[_Iterable[_Union[Digest, _Mapping]]] = ..., pte_data: _Optional[_Iterable[_Union[NamedDataEntry, _Mapping]]] = ..., external_data: _Optional[_Iterable[_Union[ExternalNamedData, _Mapping]]] = ...) -> None: ...

class NamedDataEntry(_message.Message):
    __slots__ = ("key", "buffer_index", "alignment", "tensor_layout")
    KEY_FIELD_NUMBER: _ClassVar[int]
    BUFFER_INDEX_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    key: str
    buffer_index: int
    alignment: int
    tensor_layout: NamedTensorLayout
    def __init__(self, key: _Optional[str] = ..., buffer_index: _Optional[int] = ..., alignment: _Optional[int] = ..., tensor_layout: _Optional[_Union[NamedTensorLayout, _Mapping]] = ...) -> None: ...

class NamedTensorLayout(_message.Message):
    __slots__ = ("scalar_type", "sizes", "dim_order")
    SCALAR_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    DIM_ORDER_FIELD_NUMBER: _ClassVar[int]
    scalar_type: int
    sizes: _containers.RepeatedScalarFieldContainer[int]
    dim_order: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, scalar_type: _Optional[int] = ..., sizes: _Optional[_Iterable[int]] = ..., dim_order: _Optional[_Iterable[int]] = ...) -> None: ...

class ExternalNamedData(_message.Message):
    __slots__ = ("filename", "entries")
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    filename: str
    entries: _containers.RepeatedCompositeFieldContainer[NamedDataEntry]
    def __init__(self, filename: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[NamedDataEntry, _Mapping]]] = ...) -> None: ...

class QuantizerInfo(_message.Message):
    __slots__ = ("name", "class_name", "backend_id", "spec_keys", "description", "loads_quantized_kernels", "environment")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_KEYS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LOADS_QUANTIZED_KERNELS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    class_name: str
    backend_id: str
    spec_keys: _containers.RepeatedCompositeFieldContainer[SpecKeyInfo]
    description: str
    loads_quantized_kernels: bool
    environment: str
    def __init__(self, name: _Optional[str] = ..., class_name: _Optional[str] = ..., backend_id: _Optional[str] = ..., spec_keys: _Optional[_Iterable[_Union[SpecKeyInfo, _Mapping]]] = ..., description: _Optional[str] = ..., loads_quantized_kernels: _Optional[bool] = ..., environment: _Optional[str] = ...) -> None: ...

class QuantizerRef(_message.Message):
    __slots__ = ("name", "spec")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: _containers.RepeatedCompositeFieldContainer[SpecEntry]
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Iterable[_Union[SpecEntry, _Mapping]]] = ...) -> None: ...

class UnliftTable(_message.Message):
    __slots__ = ("attrs", "guards", "attribute_names", "fingerprint", "moved_inputs")
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    GUARDS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_NAMES_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MOVED_INPUTS_FIELD_NUMBER: _ClassVar[int]
    attrs: _containers.RepeatedCompositeFieldContainer[LiftedAttr]
    guards: GuardsCall
    attribute_names: _containers.RepeatedScalarFieldContainer[str]
    fingerprint: str
    moved_inputs: _containers.RepeatedCompositeFieldContainer[MovedInput]
    def __init__(self, attrs: _Optional[_Iterable[_Union[LiftedAttr, _Mapping]]] = ..., guards: _Optional[_Union[GuardsCall, _Mapping]] = ..., attribute_names: _Optional[_Iterable[str]] = ..., fingerprint: _Optional[str] = ..., moved_inputs: _Optional[_Iterable[_Union[MovedInput, _Mapping]]] = ...) -> None: ...

class MovedInput(_message.Message):
    __slots__ = ("name", "after")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    after: str
    def __init__(self, name: _Optional[str] = ..., after: _Optional[str] = ...) -> None: ...

class LiftedAttr(_message.Message):
    __slots__ = ("name", "target", "after", "parameter", "persistent", "constant")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    name: str
    target: str
    after: str
    parameter: bool
    persistent: bool
    constant: bool
    def __init__(self, name: _Optional[str] = ..., target: _Optional[str] = ..., after: _Optional[str] = ..., parameter: _Optional[bool] = ..., persistent: _Optional[bool] = ..., constant: _Optional[bool] = ...) -> None: ...

class GuardsCall(_message.Message):
    __slots__ = ("name", "target", "after", "args", "impure")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    IMPURE_FIELD_NUMBER: _ClassVar[int]
    name: str
    target: str
    after: str
    args: _containers.RepeatedScalarFieldContainer[str]
    impure: bool
    def __init__(self, name: _Optional[str] = ..., target: _Optional[str] = ..., after: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., impure: _Optional[bool] = ...) -> None: ...

class QuantizeRequest(_message.Message):
    __slots__ = ("quantizer", "program", "program_digest", "unlift", "steps", "rng_state")
    QUANTIZER_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_DIGEST_FIELD_NUMBER: _ClassVar[int]
    UNLIFT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    quantizer: QuantizerRef
    program: Program
    program_digest: Digest
    unlift: UnliftTable
    steps: QuantizeSteps
    rng_state: bytes
    def __init__(self, quantizer: _Optional[_Union[QuantizerRef, _Mapping]] = ..., program: _Optional[_Union[Program, _Mapping]] = ..., program_digest: _Optional[_Union[Digest, _Mapping]] = ..., unlift: _Optional[_Union[UnliftTable, _Mapping]] = ..., steps: _Optional[_Union[QuantizeSteps, str]] = ..., rng_state: _Optional[bytes] = ...) -> None: ...

class QuantizeResponse(_message.Message):
    __slots__ = ("transform_edits", "transform_rng_state", "annotate_edits", "annotations", "rng_state", "raised_step", "raised", "transform_module")
    TRANSFORM_EDITS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATE_EDITS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    RNG_STATE_FIELD_NUMBER: _ClassVar[int]
    RAISED_STEP_FIELD_NUMBER: _ClassVar[int]
    RAISED_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_MODULE_FIELD_NUMBER: _ClassVar[int]
    transform_edits: GraphEdits
    transform_rng_state: bytes
    annotate_edits: GraphEdits
    annotations: Annotations
    rng_state: bytes
    raised_step: QuantizeStep
    raised: RemoteException
    transform_module: ReplacedModule
    def __init__(self, transform_edits: _Optional[_Union[GraphEdits, _Mapping]] = ..., transform_rng_state: _Optional[bytes] = ..., annotate_edits: _Optional[_Union[GraphEdits, _Mapping]] = ..., annotations: _Optional[_Union[Annotations, _Mapping]] = ..., rng_state: _Optional[bytes] = ..., raised_step: _Optional[_Union[QuantizeStep, str]] = ..., raised: _Optional[_Union[RemoteException, _Mapping]] = ..., transform_module: _Optional[_Union[ReplacedModule, _Mapping]] = ...) -> None: ...

class ReplacedModule(_message.Message):
    __slots__ = ("program", "unlift")
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    UNLIFT_FIELD_NUMBER: _ClassVar[int]
    program: Program
    unlift: UnliftTable
    def __init__(self, program: _Optional[_Union[Program, _Mapping]] = ..., unlift: _Optional[_Union[UnliftTable, _Mapping]] = ...) -> None: ...

class GraphEdits(_message.Message):
    __slots__ = ("tensors", "inserted", "changed", "erased", "fingerprint", "meta")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ERASED_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[NewTensor]
    inserted: _containers.RepeatedCompositeFieldContainer[InsertedNode]
    changed: _containers.RepeatedCompositeFieldContainer[ChangedArguments]
    erased: _containers.RepeatedScalarFieldContainer[str]
    fingerprint: str
    meta: _containers.RepeatedCompositeFieldContainer[MetaEdit]
    def __init__(self, tensors: _Optional[_Iterable[_Union[NewTensor, _Mapping]]] = ..., inserted: _Optional[_Iterable[_Union[InsertedNode, _Mapping]]] = ..., changed: _Optional[_Iterable[_Union[ChangedArguments, _Mapping]]] = ..., erased: _Optional[_Iterable[str]] = ..., fingerprint: _Optional[str] = ..., meta: _Optional[_Iterable[_Union[MetaEdit, _Mapping]]] = ...) -> None: ...

class MetaEdit(_message.Message):
    __slots__ = ("node", "key", "value", "removed")
    NODE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    node: str
    key: str
    value: MetaValue
    removed: bool
    def __init__(self, node: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[_Union[MetaValue, _Mapping]] = ..., removed: _Optional[bool] = ...) -> None: ...

class NewTensor(_message.Message):
    __slots__ = ("target", "parameter", "persistent", "dtype", "sizes", "data")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    target: str
    parameter: bool
    persistent: bool
    dtype: str
    sizes: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, target: _Optional[str] = ..., parameter: _Optional[bool] = ..., persistent: _Optional[bool] = ..., dtype: _Optional[str] = ..., sizes: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class InsertedNode(_message.Message):
    __slots__ = ("name", "op", "target", "before")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: str
    target: str
    before: str
    def __init__(self, name: _Optional[str] = ..., op: _Optional[str] = ..., target: _Optional[str] = ..., before: _Optional[str] = ...) -> None: ...

class ChangedArguments(_message.Message):
    __slots__ = ("name", "args", "kwargs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    args: _containers.RepeatedCompositeFieldContainer[Argument]
    kwargs: _containers.RepeatedCompositeFieldContainer[NamedArgument]
    def __init__(self, name: _Optional[str] = ..., args: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ..., kwargs: _Optional[_Iterable[_Union[NamedArgument, _Mapping]]] = ...) -> None: ...

class Argument(_message.Message):
    __slots__ = ("node", "int_value", "double_value", "bool_value", "string_value", "none", "list", "tuple", "dtype")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    node: str
    int_value: int
    double_value: float
    bool_value: bool
    string_value: str
    none: bool
    list: ArgumentList
    tuple: ArgumentList
    dtype: str
    def __init__(self, node: _Optional[str] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., bool_value: _Optional[bool] = ..., string_value: _Optional[str] = ..., none: _Optional[bool] = ..., list: _Optional[_Union[ArgumentList, _Mapping]] = ..., tuple: _Optional[_Union[ArgumentList, _Mapping]] = ..., dtype: _Optional[str] = ...) -> None: ...

class ArgumentList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Argument]
    def __init__(self, items: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ...) -> None: ...

class NamedArgument(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Argument
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Argument, _Mapping]] = ...) -> None: ...

class Annotations(_message.Message):
    __slots__ = ("constructors", "specs", "nodes")
    CONSTRUCTORS_FIELD_NUMBER: _ClassVar[int]
    SPECS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    constructors: _containers.RepeatedCompositeFieldContainer[Constructor]
    specs: _containers.RepeatedCompositeFieldContainer[QuantSpec]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeAnnotation]
    def __init__(self, constructors: _Optional[_Iterable[_Union[Constructor, _Mapping]]] = ..., specs: _Optional[_Iterable[_Union[QuantSpec, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeAnnotation, _Mapping]]] = ...) -> None: ...

class Constructor(_message.Message):
    __slots__ = ("class_name", "partial")
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    class_name: str
    partial: PartialConstructor
    def __init__(self, class_name: _Optional[str] = ..., partial: _Optional[_Union[PartialConstructor, _Mapping]] = ...) -> None: ...

class PartialConstructor(_message.Message):
    __slots__ = ("func", "keywords", "callable_args", "module_attribute")
    FUNC_FIELD_NUMBER: _ClassVar[int]
    KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    CALLABLE_ARGS_FIELD_NUMBER: _ClassVar[int]
    MODULE_ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    func: int
    keywords: _containers.RepeatedCompositeFieldContainer[Keyword]
    callable_args: _containers.RepeatedCompositeFieldContainer[Keyword]
    module_attribute: str
    def __init__(self, func: _Optional[int] = ..., keywords: _Optional[_Iterable[_Union[Keyword, _Mapping]]] = ..., callable_args: _Optional[_Iterable[_Union[Keyword, _Mapping]]] = ..., module_attribute: _Optional[str] = ...) -> None: ...

class Keyword(_message.Message):
    __slots__ = ("name", "double_value", "int_value", "bool_value", "string_value", "none", "dtype", "qscheme", "constructor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QSCHEME_FIELD_NUMBER: _ClassVar[int]
    CONSTRUCTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    double_value: float
    int_value: int
    bool_value: bool
    string_value: str
    none: bool
    dtype: str
    qscheme: str
    constructor: int
    def __init__(self, name: _Optional[str] = ..., double_value: _Optional[float] = ..., int_value: _Optional[int] = ..., bool_value: _Optional[bool] = ..., string_value: _Optional[str] = ..., none: _Optional[bool] = ..., dtype: _Optional[str] = ..., qscheme: _Optional[str] = ..., constructor: _Optional[int] = ...) -> None: ...

class QuantSpec(_message.Message):
    __slots__ = ("quantization", "fixed", "shared", "derived")
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    FIXED_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FIELD_NUMBER: _ClassVar[int]
    quantization: QuantizationSpec
    fixed: FixedQParamsSpec
    shared: SharedSpec
    derived: DerivedSpec
    def __init__(self, quantization: _Optional[_Union[QuantizationSpec, _Mapping]] = ..., fixed: _Optional[_Union[FixedQParamsSpec, _Mapping]] = ..., shared: _Optional[_Union[SharedSpec, _Mapping]] = ..., derived: _Optional[_Union[DerivedSpec, _Mapping]] = ...) -> None: ...

class QuantizationSpec(_message.Message):
    __slots__ = ("dtype", "constructor", "quant_min", "quant_max", "qscheme", "ch_axis", "is_dynamic")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CONSTRUCTOR_FIELD_NUMBER: _ClassVar[int]
    QUANT_MIN_FIELD_NUMBER: _ClassVar[int]
    QUANT_MAX_FIELD_NUMBER: _ClassVar[int]
    QSCHEME_FIELD_NUMBER: _ClassVar[int]
    CH_AXIS_FIELD_NUMBER: _ClassVar[int]
    IS_DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    constructor: int
    quant_min: int
    quant_max: int
    qscheme: str
    ch_axis: int
    is_dynamic: bool
    def __init__(self, dtype: _Optional[str] = ..., constructor: _Optional[int] = ..., quant_min: _Optional[int] = ..., quant_max: _Optional[int] = ..., qscheme: _Optional[str] = ..., ch_axis: _Optional[int] = ..., is_dynamic: _Optional[bool] = ...) -> None: ...

class FixedQParamsSpec(_message.Message):
    __slots__ = ("dtype", "scale", "zero_point", "quant_min", "quant_max", "qscheme", "is_dynamic")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    ZERO_POINT_FIELD_NUMBER: _ClassVar[int]
    QUANT_MIN_FIELD_NUMBER: _ClassVar[int]
    QUANT_MAX_FIELD_NUMBER: _ClassVar[int]
    QSCHEME_FIELD_NUMBER: _ClassVar[int]
    IS_DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    qscheme: str
    is_dynamic: bool
    def __init__(self, dtype: _Optional[str] = ..., scale: _Optional[float] = ..., zero_point: _Optional[int] = ..., quant_min: _Optional[int] = ..., quant_max: _Optional[int] = ..., qscheme: _Optional[str] = ..., is_dynamic: _Optional[bool] = ...) -> None: ...

class EdgeOrNode(_message.Message):
    __slots__ = ("node", "edge")
    NODE_FIELD_NUMBER: _ClassVar[int]
    EDGE_FIELD_NUMBER: _ClassVar[int]
    node: str
    edge: Edge
    def __init__(self, node: _Optional[str] = ..., edge: _Optional[_Union[Edge, _Mapping]] = ...) -> None: ...

class Edge(_message.Message):
    __slots__ = ("input", "user")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    input: str
    user: str
    def __init__(self, input: _Optional[str] = ..., user: _Optional[str] = ...) -> None: ...

class SharedSpec(_message.Message):
    __slots__ = ("edge_or_node",)
    EDGE_OR_NODE_FIELD_NUMBER: _ClassVar[int]
    edge_or_node: EdgeOrNode
    def __init__(self, edge_or_node: _Optional[_Union[EdgeOrNode, _Mapping]] = ...) -> None: ...

class DerivedSpec(_message.Message):
    __slots__ = ("derived_from", "derive_qparams_fn", "dtype", "quant_min", "quant_max", "qscheme", "ch_axis", "is_dynamic", "derived_from_tuple")
    DERIVED_FROM_FIELD_NUMBER: _ClassVar[int]
    DERIVE_QPARAMS_FN_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUANT_MIN_FIELD_NUMBER: _ClassVar[int]
    QUANT_MAX_FIELD_NUMBER: _ClassVar[int]
    QSCHEME_FIELD_NUMBER: _ClassVar[int]
    CH_AXIS_FIELD_NUMBER: _ClassVar[int]
    IS_DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FROM_TUPLE_FIELD_NUMBER: _ClassVar[int]
    derived_from: _containers.RepeatedCompositeFieldContainer[EdgeOrNode]
    derive_qparams_fn: str
    dtype: str
    quant_min: int
    quant_max: int
    qscheme: str
    ch_axis: int
    is_dynamic: bool
    derived_from_tuple: bool
    def __init__(self, derived_from: _Optional[_Iterable[_Union[EdgeOrNode, _Mapping]]] = ..., derive_qparams_fn: _Optional[str] = ..., dtype: _Optional[str] = ..., quant_min: _Optional[int] = ..., quant_max: _Optional[int] = ..., qscheme: _Optional[str] = ..., ch_axis: _Optional[int] = ..., is_dynamic: _Optional[bool] = ..., derived_from_tuple: _Optional[bool] = ...) -> None: ...

class NodeAnnotation(_message.Message):
    __slots__ = ("node", "inputs", "output_spec", "allow_implicit_sharing", "annotated", "object")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SPEC_FIELD_NUMBER: _ClassVar[int]
    ALLOW_IMPLICIT_SHARING_FIELD_NUMBER: _ClassVar[int]
    ANNOTATED_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    node: str
    inputs: _containers.RepeatedCompositeFieldContainer[InputSpecEntry]
    output_spec: int
    allow_implicit_sharing: bool
    annotated: bool
    object: int
    def __init__(self, node: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[InputSpecEntry, _Mapping]]] = ..., output_spec: _Optional[int] = ..., allow_implicit_sharing: _Optional[bool] = ..., annotated: _Optional[bool] = ..., object: _Optional[int] = ...) -> None: ...

class InputSpecEntry(_message.Message):
    __slots__ = ("input", "spec")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    input: str
    spec: int
    def __init__(self, input: _Optional[str] = ..., spec: _Optional[int] = ...) -> None: ...
