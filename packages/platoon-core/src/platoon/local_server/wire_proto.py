"""The local server's second wire: the protobuf bodies the Tinker SDK uses from 0.25 on.

Such an SDK sends `forward_backward` (and `forward`, as `forward_only`) as an `application/x-protobuf`
`ForwardBackwardRequest`, zstd-compressed when the server's client config asks for it, and asks for
`SampleResponse` and `ForwardBackwardOutput` results as protobuf (`Accept: application/x-protobuf`); an older SDK
speaks JSON throughout. The messages below are platoon's own, declared from a table with the field numbers and types
of that wire: only the messages and fields the local server reads or writes (a parser skips fields it does not
know). Decoding turns a request into the JSON body the server's own checks read, and encoding turns a JSON result
into its message, so both wires share every check and every answer. google.protobuf and zstandard are imported on
first use; the SDK's own proto modules never are (SDK 0.16.1 has none).
"""

from __future__ import annotations

import array
import functools
import io
import math
import sys
from collections.abc import Callable
from typing import Any

#: the media type of a protobuf body, in Content-Type and Accept
PROTO_MEDIA_TYPE = "application/x-protobuf"
#: the one Content-Encoding the server decodes (besides identity)
ZSTD_ENCODING = "zstd"
#: a tensor of more dimensions is refused before its shape is read: the SDK's tensors have one or two
MAX_TENSOR_RANK = 16
#: `TopkLogprobs` fills a position the server gave no entry with token 0 at this logprob (the SDK reads it as None)
TOPK_MASK_LOGPROB = -99999.0

_PACKAGE = "platoon.local_tinker"
#: enum name -> its values, by number
_ENUMS: dict[str, list[str]] = {
    "DType": ["DTYPE_UNSPECIFIED", "DTYPE_FLOAT32", "DTYPE_INT64", "DTYPE_INT32", "DTYPE_BFLOAT16"],
    "StopReason": ["STOP_REASON_STOP", "STOP_REASON_LENGTH"],
}
#: message -> its fields as (number, name, type, oneof). A type is a scalar, an enum or message name, "repeated T",
#: or "map K V". Token ids travel as int32 bytes, tensors as little-endian bytes of their dtype.
_MESSAGES: dict[str, list[tuple[int, str, str, str | None]]] = {
    # requests
    "ForwardBackwardRequest": [
        (1, "model_id", "string", None),
        (2, "seq_id", "int32", None),
        (3, "data", "repeated Datum", None),
        (4, "loss_fn", "string", None),
        (5, "loss_fn_config", "map string double", None),
        (6, "forward_only", "bool", None),
        (7, "loss_fn_config_v2", "map string LossConfigValue", None),
    ],
    "LossConfigValue": [(1, "number", "double", "value"), (2, "text", "string", "value")],
    # fields 3 and 4 (provenance spans) are not read: the local server has no use for them
    "Datum": [(1, "model_input", "repeated Chunk", None), (2, "loss_fn_inputs", "map string Tensor", None)],
    "Chunk": [
        (1, "encoded_text", "EncodedTextChunk", "chunk"),
        (2, "image", "ImageChunk", "chunk"),
        (3, "dmel", "DmelChunk", "chunk"),
    ],
    "EncodedTextChunk": [(1, "tokens", "bytes", None)],
    # images and audio are refused by kind, so their contents are never read
    "ImageChunk": [],
    "DmelChunk": [],
    "Tensor": [
        (1, "dense", "bytes", "encoding"),
        (2, "sparse_csr", "SparseCsr", "encoding"),
        (3, "dtype", "DType", None),
        (4, "shape", "repeated int64", None),
    ],
    "SparseCsr": [],
    # results
    "SampleResponse": [
        (1, "sequences", "repeated SampledSequence", None),
        (2, "prompt_logprobs", "bytes", None),
        (3, "topk_prompt_logprobs", "TopkLogprobs", None),
        (4, "prompt_cache_hit_tokens", "int32", None),
    ],
    "SampledSequence": [
        (1, "stop_reason", "StopReason", None),
        (2, "tokens", "bytes", None),
        (3, "logprobs", "bytes", None),
    ],
    "TopkLogprobs": [
        (1, "token_ids", "bytes", None),
        (2, "logprobs", "bytes", None),
        (3, "k", "uint32", None),
        (4, "length", "uint32", None),
    ],
    "ForwardBackwardOutput": [
        (1, "loss_fn_output_type", "string", None),
        (2, "loss_fn_outputs", "repeated ArrayRecord", None),
        (3, "metrics", "map string double", None),
    ],
    "ArrayRecord": [
        (1, "type_tag", "string", None),
        (2, "fields", "map string BatchedTensor", None),
        (3, "num_datums", "int64", None),
    ],
    # one field of several datums: their values end to end, and each datum's byte offset (int64, one more than
    # the datums); each datum's shape is [its length / prod(trailing_shape), *trailing_shape]
    "BatchedTensor": [
        (1, "data", "bytes", None),
        (2, "offsets", "bytes", None),
        (3, "dtype", "DType", None),
        (4, "trailing_shape", "repeated int64", None),
    ],
}
_SCALARS = ("double", "float", "int64", "uint64", "int32", "uint32", "bool", "string", "bytes")
#: TensorData's dtype -> (the DType number, the array typecode of its bytes)
_DTYPES: dict[str, tuple[int, str]] = {"float32": (1, "f"), "int64": (2, "q")}
_STOP_REASONS = {"stop": 0, "length": 1}


class WireError(ValueError):
    """A body the protobuf wire cannot read (the server answers 400 with its message) or, with `status`, refuses."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# -- the messages


@functools.cache
def _classes() -> dict[str, Any]:
    """The message classes, by name, built once from the table above."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field_type = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="platoon_local_tinker.proto", package=_PACKAGE, syntax="proto3"
    )
    for enum_name, values in _ENUMS.items():
        enum = file.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)

    def set_type(field: Any, kind: str) -> None:
        if kind in _SCALARS:
            field.type = getattr(field_type, f"TYPE_{kind.upper()}")
        else:
            field.type = field_type.TYPE_ENUM if kind in _ENUMS else field_type.TYPE_MESSAGE
            field.type_name = f".{_PACKAGE}.{kind}"

    for message_name, fields in _MESSAGES.items():
        message = file.message_type.add(name=message_name)
        oneofs: list[str] = []
        for number, name, kind, oneof in fields:
            field = message.field.add(name=name, number=number, label=field_type.LABEL_OPTIONAL)
            words = kind.split()
            if words[0] == "map":
                # a map is a repeated entry message of its own, marked map_entry
                entry = message.nested_type.add(name=f"{name.title().replace('_', '')}Entry")
                entry.options.map_entry = True
                for entry_number, entry_name, entry_kind in ((1, "key", words[1]), (2, "value", words[2])):
                    entry_field = entry.field.add(name=entry_name, number=entry_number)
                    entry_field.label = field_type.LABEL_OPTIONAL
                    set_type(entry_field, entry_kind)
                field.label = field_type.LABEL_REPEATED
                field.type = field_type.TYPE_MESSAGE
                field.type_name = f".{_PACKAGE}.{message_name}.{entry.name}"
                continue
            if words[0] == "repeated":
                field.label = field_type.LABEL_REPEATED
                words = words[1:]
            set_type(field, words[0])
            if oneof is not None:
                if oneof not in oneofs:
                    oneofs.append(oneof)
                    message.oneof_decl.add(name=oneof)
                field.oneof_index = oneofs.index(oneof)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


def message_class(name: str) -> Any:
    """The class of one of the wire's messages (`ForwardBackwardRequest`, `SampleResponse`, ...)."""
    return _classes()[name]


# -- bytes of numbers (little-endian, as the SDK reads and writes them with numpy)


def _pack(typecode: str, values: Any) -> bytes:
    packed = array.array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack(typecode: str, raw: bytes, where: str) -> list[Any]:
    values = array.array(typecode)
    if len(raw) % values.itemsize:
        raise WireError(
            f"{where} holds {len(raw)} bytes, not a whole number of {values.itemsize}-byte values"
        )
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


# -- requests


def decompress(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """`raw` decoded by its Content-Encoding (none or zstd), never past `limit` bytes (413 past it)."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return raw
    if name != ZSTD_ENCODING:
        raise WireError(f"the local server reads no Content-Encoding {encoding!r} (only zstd)", status=415)
    import zstandard

    too_large = WireError(
        f"the request body is over the local server's limit of {limit} bytes once decompressed "
        "(platoon tinker serve --max-body-mib or LocalTinkerServer(max_body_bytes=...) raises it)",
        status=413,
    )
    # A frame's window is memory the decoder holds: no more than the body it could fill is granted.
    max_window = max(limit, 1 << 20)
    try:
        frame = zstandard.get_frame_parameters(raw)
    except zstandard.ZstdError as exc:
        raise WireError(f"the request body is not valid zstd ({exc})") from None
    declared = None if frame.content_size == zstandard.CONTENTSIZE_UNKNOWN else frame.content_size
    if frame.window_size > max_window or (declared is not None and declared > limit):
        raise too_large
    # Read in pieces to one byte past the limit: the declared size is not trusted (a few KB can claim, and hold,
    # gigabytes), nor does it count the frames after the first.
    reader = zstandard.ZstdDecompressor(max_window_size=max_window).stream_reader(
        raw, read_across_frames=True
    )
    pieces = io.BytesIO()
    try:
        while piece := reader.read(min(limit + 1 - pieces.tell(), 1 << 20)):
            pieces.write(piece)
            if pieces.tell() > limit:
                raise too_large
    except zstandard.ZstdError as exc:
        raise WireError(f"the request body is not valid zstd ({exc})") from None
    return pieces.getvalue()


def forward_backward_body(raw: bytes) -> tuple[dict[str, Any], bool]:
    """A protobuf `ForwardBackwardRequest` as the JSON body of `forward_backward`, and whether it is forward only.

    Its datums come out as the JSON wire's (`encoded_text` chunks, `TensorData` dicts), for the same checks.
    """
    from google.protobuf.message import DecodeError

    request = message_class("ForwardBackwardRequest")()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(f"the request body is not a protobuf ForwardBackwardRequest ({exc})") from None
    key = "forward_input" if request.forward_only else "forward_backward_input"
    config: dict[str, Any] = dict(request.loss_fn_config)
    for name, value in request.loss_fn_config_v2.items():
        # the SDK writes numbers to both maps and text only to v2; v2 wins where both name a key
        config[name] = getattr(value, value.WhichOneof("value") or "number")
    data = [_datum(datum, f"{key}.data[{index}]") for index, datum in enumerate(request.data)]
    body = {
        "model_id": request.model_id,
        # proto3 cannot tell 0 from unset, and the SDK counts from 1: 0 is no seq_id (never de-duplicated)
        "seq_id": request.seq_id or None,
        key: {"data": data, "loss_fn": request.loss_fn, "loss_fn_config": config or None},
    }
    return body, request.forward_only


def _datum(datum: Any, where: str) -> dict[str, Any]:
    chunks = []
    for index, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            got = "an empty chunk" if kind is None else kind
            raise WireError(
                f"the local server takes only encoded_text chunks, not {got} ({where}.model_input)"
            )
        tokens = _unpack("i", chunk.encoded_text.tokens, f"{where}.model_input.chunks[{index}].tokens")
        chunks.append({"type": "encoded_text", "tokens": tokens})
    inputs = {
        name: _tensor(tensor, f"{where}.loss_fn_inputs[{name!r}]")
        for name, tensor in datum.loss_fn_inputs.items()
    }
    return {"model_input": {"chunks": chunks}, "loss_fn_inputs": inputs}


def _tensor(tensor: Any, where: str) -> dict[str, Any]:
    """A `Tensor` as `TensorData`; its shape against its values is checked with the JSON wire's."""
    if tensor.WhichOneof("encoding") == "sparse_csr":
        raise WireError(f"{where} is a sparse tensor; the local server takes only dense ones")
    dtype = next((name for name, (number, _) in _DTYPES.items() if number == tensor.dtype), None)
    if dtype is None:
        raise WireError(f"{where} has dtype number {tensor.dtype}, not float32 (1) or int64 (2)")
    if len(tensor.shape) > MAX_TENSOR_RANK:
        raise WireError(
            f"{where} has {len(tensor.shape)} dimensions; the local server takes at most {MAX_TENSOR_RANK}"
        )
    data = _unpack(_DTYPES[dtype][1], tensor.dense, where)
    return {"data": data, "dtype": dtype, "shape": list(tensor.shape)}


# -- results


def encoder_for(result: dict[str, Any]) -> Callable[[dict[str, Any]], bytes] | None:
    """The encoder of a finished future's JSON result when the protobuf wire carries it, else None (errors too)."""
    if "error" in result:
        return None
    if result.get("type") == "sample" and isinstance(result.get("sequences"), list):
        return encode_sample_response
    if "loss_fn_output_type" in result and isinstance(result.get("loss_fn_outputs"), list):
        return encode_forward_backward_output
    return None


def encode_sample_response(result: dict[str, Any]) -> bytes:
    """A JSON `SampleResponse` as its message; a prompt logprob of None travels as NaN, as the SDK reads it."""
    response = message_class("SampleResponse")()
    for sequence in result["sequences"]:
        written = response.sequences.add()
        written.stop_reason = _STOP_REASONS[sequence.get("stop_reason") or "length"]
        written.tokens = _pack("i", sequence["tokens"])
        if sequence.get("logprobs") is not None:
            written.logprobs = _pack("f", sequence["logprobs"])
    prompt_logprobs = result.get("prompt_logprobs")
    if prompt_logprobs is not None:
        response.prompt_logprobs = _pack("f", [math.nan if v is None else v for v in prompt_logprobs])
    topk = result.get("topk_prompt_logprobs")
    if topk is not None:
        # dense (positions x k) matrices; a position with fewer entries, or none, is filled with the mask
        k = max((len(row) for row in topk if row), default=0)
        ids: list[int] = []
        logprobs: list[float] = []
        for row in topk:
            entries = list(row or [])
            padding = k - len(entries)
            ids += [int(token) for token, _ in entries] + [0] * padding
            logprobs += [float(value) for _, value in entries] + [TOPK_MASK_LOGPROB] * padding
        written_topk = response.topk_prompt_logprobs
        written_topk.token_ids = _pack("i", ids)
        written_topk.logprobs = _pack("f", logprobs)
        written_topk.k = k
        written_topk.length = len(topk)
    return bytes(response.SerializeToString())


def encode_forward_backward_output(result: dict[str, Any]) -> bytes:
    """A JSON `ForwardBackwardOutput` as its message: each run of datums whose fields agree in dtype and trailing
    shape is one `ArrayRecord`, each field one `BatchedTensor` of their values end to end."""
    output = message_class("ForwardBackwardOutput")()
    output.loss_fn_output_type = str(result.get("loss_fn_output_type") or "ArrayRecord")
    for name, value in (result.get("metrics") or {}).items():
        output.metrics[name] = float(value)
    run: list[dict[str, Any]] = []
    layout: tuple[Any, ...] | None = None
    for datum in result["loss_fn_outputs"]:
        datum_layout = tuple(
            sorted((name, tensor["dtype"], tuple(_shape(tensor)[1:])) for name, tensor in datum.items())
        )
        if run and datum_layout != layout:
            _add_record(output, run)
            run = []
        run.append(datum)
        layout = datum_layout
    if run:
        _add_record(output, run)
    return bytes(output.SerializeToString())


def _shape(tensor: dict[str, Any]) -> list[int]:
    shape = tensor.get("shape")
    return list(shape) if shape else [len(tensor["data"])]


def _add_record(output: Any, datums: list[dict[str, Any]]) -> None:
    record = output.loss_fn_outputs.add()
    record.type_tag = output.loss_fn_output_type
    record.num_datums = len(datums)
    for name, first in datums[0].items():
        number, typecode = _DTYPES[first["dtype"]]
        values: list[Any] = []
        offsets = [0]
        for datum in datums:
            values += datum[name]["data"]
            offsets.append(len(values) * array.array(typecode).itemsize)
        batched = record.fields[name]
        batched.dtype = number
        batched.data = _pack(typecode, values)
        batched.offsets = _pack("q", offsets)
        batched.trailing_shape.extend(_shape(first)[1:])
