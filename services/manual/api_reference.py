"""`docs/reference/grpc-api.md`: every service, RPC, message and enum of the mesh's
protos (`protos/oms/v1/*.proto`), with the comments written beside them.

protoc (grpc_tools') compiles the protos into a FileDescriptorSet with source info;
each element's leading and trailing comments come from there. An element without a
comment is listed all the same (`uncommented()` names them).
"""

from __future__ import annotations

import importlib.resources
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc  # type: ignore[import-untyped]

from services.manual.markdown import cell, generated_note, table

PAGE = Path("docs/reference/grpc-api.md")
ROOT = Path(__file__).resolve().parents[2]
PROTO_FOLDER = Path("protos/oms/v1")
PACKAGE = "oms.v1"
# The public API first, then the mesh's own links; a proto not named here comes last.
FILE_ORDER = (
    "gateway.proto",
    "common.proto",
    "status.proto",
    "shard.proto",
    "matcher.proto",
    "persister.proto",
    "replica.proto",
)

# Paths into FileDescriptorProto (descriptor.proto's field numbers), for source info.
_MESSAGE, _ENUM, _SERVICE, _SYNTAX = 4, 5, 6, 12
_FIELD, _NESTED, _NESTED_ENUM, _VALUE, _METHOD = 2, 3, 4, 2, 2

_SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def proto_files(root: Path = ROOT) -> list[str]:
    """The protos, repository-relative, in page order."""
    found = sorted(path.name for path in (root / PROTO_FOLDER).glob("*.proto"))
    order = [name for name in FILE_ORDER if name in found]
    order += [name for name in found if name not in FILE_ORDER]
    return [(PROTO_FOLDER / name).as_posix() for name in order]


def descriptor_set(root: Path = ROOT) -> descriptor_pb2.FileDescriptorSet:
    """The protos compiled by protoc, with their comments."""
    files = proto_files(root)
    google = importlib.resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "protos.pb"
        status = protoc.main(
            [
                "protoc",
                f"-I{root}",
                f"-I{google}",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                *(str(root / name) for name in files),
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed ({status}) on {files}")
        compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    by_name = {file.name: file for file in compiled.file}
    ordered = descriptor_pb2.FileDescriptorSet()
    ordered.file.extend(by_name[name] for name in files)
    return ordered


# --- comments ------------------------------------------------------------------------


@dataclass(frozen=True)
class Comments:
    leading: str
    trailing: str
    detached: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n\n".join(part for part in (self.leading, self.trailing) if part)


def _clean(comment: str) -> str:
    """A comment's text without the one space after `//` and without outer blank lines."""
    lines = comment.split("\n")
    lines = [line[1:] if line.startswith(" ") else line for line in lines]
    return "\n".join(lines).strip("\n").rstrip()


def comments_of(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], Comments]:
    return {
        tuple(location.path): Comments(
            _clean(location.leading_comments),
            _clean(location.trailing_comments),
            tuple(_clean(text) for text in location.leading_detached_comments),
        )
        for location in file.source_code_info.location
    }


_NONE = Comments("", "", ())


def _prose(comment: str) -> list[str]:
    """A comment as Markdown: a text block when its lines are laid out (indented lines,
    grammars), else paragraphs."""
    if not comment:
        return []
    lines = comment.split("\n")
    if any(line.startswith(" ") for line in lines):
        return ["```text", textwrap.dedent(comment), "```", ""]
    paragraphs = [" ".join(part.split()) for part in comment.split("\n\n")]
    return [line for paragraph in paragraphs for line in (cell(paragraph), "")]


# --- elements ------------------------------------------------------------------------


@dataclass(frozen=True)
class Element:
    """One service, RPC, message, field, enum or enum value, and its comment."""

    kind: str
    name: str  # full name within the package: `OrderGateway.PlaceOrder`, `Order.price`
    file: str
    comment: str


def _anchor(name: str) -> str:
    return "-".join(name.lower().split("."))


def _local(type_name: str) -> str:
    """`.oms.v1.Order.Side` -> `Order.Side` (a name outside the package stays whole)."""
    prefix = f".{PACKAGE}."
    return type_name[len(prefix) :] if type_name.startswith(prefix) else type_name.lstrip(".")


class _Files:
    """The descriptor set, indexed: messages by full name (for map entries)."""

    def __init__(self, compiled: descriptor_pb2.FileDescriptorSet) -> None:
        self.compiled = compiled
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        for file in compiled.file:
            for message in file.message_type:
                self._index(f".{file.package}.{message.name}", message)

    def _index(self, name: str, message: descriptor_pb2.DescriptorProto) -> None:
        self.messages[name] = message
        for nested in message.nested_type:
            self._index(f"{name}.{nested.name}", nested)

    def type_of(self, field: descriptor_pb2.FieldDescriptorProto) -> str:
        """The field's type as Markdown, linked when it is the package's own."""
        if field.type in _SCALARS:
            return f"`{_SCALARS[field.type]}`"
        entry = self.messages.get(field.type_name)
        if entry is not None and entry.options.map_entry:
            key, value = entry.field
            return f"map&lt;{self.type_of(key)}, {self.type_of(value)}&gt;"
        local = _local(field.type_name)
        if field.type_name.startswith(f".{PACKAGE}."):
            return f"[`{local}`](#{_anchor(local)})"
        return f"`{local}`"

    def is_map(self, field: descriptor_pb2.FieldDescriptorProto) -> bool:
        entry = self.messages.get(field.type_name)
        return entry is not None and entry.options.map_entry


def _label(
    message: descriptor_pb2.DescriptorProto,
    field: descriptor_pb2.FieldDescriptorProto,
    files: _Files,
) -> str:
    if files.is_map(field):
        return ""
    if field.proto3_optional:
        return "optional"
    if field.HasField("oneof_index"):
        return f"oneof `{message.oneof_decl[field.oneof_index].name}`"
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return "repeated"
    return ""


class _FileWriter:
    """The sections of one proto file; every element it renders is added to `elements`."""

    def __init__(
        self, file: descriptor_pb2.FileDescriptorProto, files: _Files, elements: list[Element]
    ) -> None:
        self.file = file
        self.files = files
        self.elements = elements
        self.comments = comments_of(file)

    def _comment(self, kind: str, name: str, path: tuple[int, ...]) -> str:
        comment = self.comments.get(path, _NONE).text
        self.elements.append(Element(kind, name, self.file.name, comment))
        return comment

    def message(
        self, message: descriptor_pb2.DescriptorProto, name: str, path: tuple[int, ...]
    ) -> list[str]:
        if message.options.map_entry:
            return []
        comment = self._comment("message", name, path)
        lines = [f"#### {name} {{#{_anchor(name)}}}", "", *_prose(comment)]
        rows = []
        for index, field in enumerate(message.field):
            field_comment = self._comment("field", f"{name}.{field.name}", (*path, _FIELD, index))
            rows.append(
                [
                    str(field.number),
                    f"`{field.name}`",
                    self.files.type_of(field),
                    _label(message, field, self.files),
                    cell(field_comment),
                ]
            )
        if rows:
            lines += [*table(("#", "Field", "Type", "Label", "Comment"), rows), ""]
        else:
            lines += ["No fields.", ""]
        for index, nested in enumerate(message.nested_type):
            lines += self.message(nested, f"{name}.{nested.name}", (*path, _NESTED, index))
        for index, enum in enumerate(message.enum_type):
            lines += self.enum(enum, f"{name}.{enum.name}", (*path, _NESTED_ENUM, index))
        return lines

    def enum(
        self, enum: descriptor_pb2.EnumDescriptorProto, name: str, path: tuple[int, ...]
    ) -> list[str]:
        comment = self._comment("enum", name, path)
        rows = []
        for index, value in enumerate(enum.value):
            value_comment = self._comment(
                "enum value", f"{name}.{value.name}", (*path, _VALUE, index)
            )
            rows.append([f"`{value.name}`", str(value.number), cell(value_comment)])
        return [
            f"#### {name} {{#{_anchor(name)}}}",
            "",
            *_prose(comment),
            *table(("Value", "Number", "Comment"), rows),
            "",
        ]

    def service(
        self, service: descriptor_pb2.ServiceDescriptorProto, path: tuple[int, ...]
    ) -> list[str]:
        comment = self._comment("service", service.name, path)
        rows = []
        for index, method in enumerate(service.method):
            method_comment = self._comment(
                "rpc", f"{service.name}.{method.name}", (*path, _METHOD, index)
            )
            request = _local(method.input_type)
            response = _local(method.output_type)
            rows.append(
                [
                    f"`{method.name}`",
                    ("stream " if method.client_streaming else "")
                    + f"[`{request}`](#{_anchor(request)})",
                    ("stream " if method.server_streaming else "")
                    + f"[`{response}`](#{_anchor(response)})",
                    cell(method_comment),
                ]
            )
        return [
            f"### service {service.name} {{#{_anchor(service.name)}}}",
            "",
            f"`/{PACKAGE}.{service.name}/<RPC>`.",
            "",
            *_prose(comment),
            *table(("RPC", "Request", "Response", "Comment"), rows),
            "",
        ]

    def section(self) -> list[str]:
        file = self.file
        header = self.comments.get((_SYNTAX,), _NONE)
        title = Path(file.name).name
        lines = [f"## {title} {{#{_anchor(Path(file.name).stem)}-proto}}", ""]
        lines += [f"`{file.name}`", ""]
        for detached in header.detached:
            lines += _prose(detached)
        lines += _prose(header.leading)
        for index, service in enumerate(file.service):
            lines += self.service(service, (_SERVICE, index))
        if file.message_type or file.enum_type:
            lines += [f"### Messages and enums of {title}", ""]
        for index, enum in enumerate(file.enum_type):
            lines += self.enum(enum, enum.name, (_ENUM, index))
        for index, message in enumerate(file.message_type):
            lines += self.message(message, message.name, (_MESSAGE, index))
        return lines


def _render(compiled: descriptor_pb2.FileDescriptorSet) -> tuple[str, list[Element]]:
    files = _Files(compiled)
    elements: list[Element] = []
    body: list[str] = []
    for file in compiled.file:
        body += _FileWriter(file, files, elements).section()
    count = {kind: sum(e.kind == kind for e in elements) for kind in ("service", "rpc")}
    lines = [
        generated_note(
            "services/manual/api_reference.py",
            "the comments of `protos/oms/v1/*.proto` (compiled by grpc_tools' protoc)",
        ),
        "# gRPC API",
        "",
        f"Every gRPC service of the mesh, package `{PACKAGE}`: {count['service']} services,"
        f" {count['rpc']} RPCs. Clients use `OrderGateway` and `AdminGateway`"
        " (`protos/oms/v1/gateway.proto`), the gateway's public port; every other service"
        " is a link inside the mesh (mutual TLS). `Status` is served by every process. Each"
        " comment is the one written beside the element in its proto.",
        "",
        *body,
    ]
    return "\n".join(lines).rstrip("\n") + "\n", elements


def render() -> str:
    return _render(descriptor_set())[0]


def elements() -> list[Element]:
    return _render(descriptor_set())[1]


def uncommented(
    kinds: Sequence[str] = ("rpc", "field", "message", "enum", "enum value"),
) -> list[Element]:
    """The elements with no comment of their own, of `kinds`."""
    return [e for e in elements() if e.kind in kinds and not e.comment]


def _iter_kinds(found: list[Element]) -> Iterator[tuple[str, int]]:
    for kind in ("service", "rpc", "message", "field", "enum", "enum value"):
        yield kind, sum(element.kind == kind for element in found)
