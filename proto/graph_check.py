"""Checks of the export schema's JSON that keep a client's program from running code.

torch's (and exir's) deserializers turn parts of the JSON into code or imports without any
pickle: a node target names a Python callable to call, a symbolic expression goes to
``sympy.sympify`` (an eval), a graph name is written into the ``forward`` that FX generates and
execs, and a treespec may name modules to import. Every field that could do so is checked here,
before any deserializer sees the JSON:

* node targets against an allow-list (:func:`check_target`: registered operators and a few
  safe functions);
* every other field by its name (the export schema names them consistently):
  :func:`check_fields` for a whole document, :func:`field_rule` field by field for the PT2
  archive reader;
* :func:`checked_graph_json` parses a graph blob and applies both.

This module imports nothing of the codec (its exceptions are
:mod:`remote_partitioner.proto.program_errors`): the codec's decoder imports it.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from collections import OrderedDict, defaultdict
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._sympy.symbol import prefix_str

from remote_partitioner.proto.program_errors import ProgramDecodeError

__all__ = [
    "UnsafeGraphError",
    "check_fields",
    "check_fqn",
    "check_target",
    "checked_graph_json",
    "field_rule",
]


class UnsafeGraphError(ProgramDecodeError):
    """Code where only data belongs (e.g. ``guards_code`` that is not a shape guard)."""


# --------------------------------------------------------------------------------------------
# Node targets


# Python functions a graph may call besides registered operators: the symbolic-size arithmetic
# that torch.export records (operator.*, math.*, torch.sym_*) and ExecuTorch's memory ops.
_SAFE_FUNCTIONS = frozenset(
    [f"_operator.{n}" for n in (
        "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg", "pos",
        "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_", "abs",
    )]
    + [f"math.{n}" for n in ("ceil", "floor", "trunc", "sqrt")]
    + [f"torch.{n}" for n in (
        "sym_float", "sym_int", "sym_ite", "sym_max", "sym_min", "sym_not", "sym_sqrt",
        "sym_sum", "_sym_sqrt", "sym_constrain_range", "sym_constrain_range_for_size",
    )]
    + ["executorch.exir.memory.view", "memory.alloc"]
)
_OP_PREFIXES = {
    "torch.ops.": 2,
    "executorch.exir.dialects.edge.ops.": 5,
    "executorch.exir.dialects.backend.ops.": 5,
}


def check_target(target: str) -> None:
    """Accept only targets that resolve to registered operators or to the few safe functions
    above; :class:`ProgramDecodeError` otherwise. Nothing a client sends names code to run.

    Operators: ``torch.ops.<namespace>.<op>.<overload>`` (and ``torch.ops.higher_order.<op>``),
    and the ExecuTorch edge and backend dialects' ``...ops.<namespace>.<op>.<overload>``.
    """
    if target in _SAFE_FUNCTIONS:
        return
    for prefix, skip in _OP_PREFIXES.items():
        if not target.startswith(prefix):
            continue
        parts = target.split(".")[skip:]
        if not 2 <= len(parts) <= 3 or not all(
            p.isidentifier() and not p.startswith("__") for p in parts
        ):
            break
        if prefix == "torch.ops.":
            resolved: Any = torch.ops
        elif "edge" in prefix:
            from executorch.exir.dialects._ops import ops as exir_ops

            resolved = exir_ops.edge
        else:
            from executorch.exir.dialects._ops import ops as exir_ops

            resolved = exir_ops.backend
        try:
            for p in parts:
                resolved = getattr(resolved, p)
        except (AttributeError, RuntimeError):
            break
        kinds: tuple[type, ...] = (torch._ops.OpOverload, torch._ops.HigherOrderOperator)
        if isinstance(resolved, kinds) or type(resolved).__name__ in (
            "EdgeOpOverload", "BackendOpOverload"
        ):
            return
        break
    raise ProgramDecodeError(
        f"graph target {target[:200]!r} is not a registered operator: refused"
    )


def _check_targets(value: Any) -> None:
    """Check the target of every node of the serialized graph, nested graphs included."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "target" in v and "inputs" in v and "outputs" in v:
                if not isinstance(v["target"], str):
                    raise ProgramDecodeError("a graph node's target is not a string")
                check_target(v["target"])
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def checked_graph_json(raw: bytes) -> Any:
    """The export schema's JSON (bytes), parsed, with every node target checked by
    :func:`check_target`; :class:`ProgramDecodeError` if it is not a JSON object or names
    anything else."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProgramDecodeError(
            f"the program's graph cannot be deserialized: not JSON: {e}"
        ) from None
    if not isinstance(value, dict):
        raise ProgramDecodeError("the program's graph cannot be deserialized: not a JSON object")
    _check_targets(value)
    try:
        check_fields(value)
    except RecursionError:
        raise ProgramDecodeError("the program's graph is nested too deeply") from None
    return value



# --------------------------------------------------------------------------------------------
# Fields


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 500 else text[:500] + "..."


_IDENTIFIER_FIELDS = frozenset(
    ["name", "as_name", "user_input_name"]  # graph names: placeholders, nodes, kwargs, subgraphs
)
_FQN_FIELDS = frozenset(
    ["parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name", "fqn"]
)
_GRAPH_NAME_MAPS = frozenset(
    ["tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values"]
)

# A symbolic expression is written by sympy's srepr (``Add(Mul(Integer(2), Symbol('s0',
# positive=True, integer=True)), Integer(1))``) and read back by ``sympy.sympify``, i.e. eval.
# It may only use: the classes and functions srepr and torch's deserializer name, sympy's
# assumption keywords, numbers, bare symbol names (s0, u3, zf1, ...: torch's prefixes), and a
# string literal only as the first argument of Symbol (a symbol name) or Float (a decimal).
# Anything else (builtins, sympy's `test` or `preview`, attribute access, subscripts, lambdas,
# other strings, which sympify parses as more code) is refused.
_SYMBOL = re.compile(
    "^(?:"
    + "|".join(
        sorted((re.escape(p) for p in prefix_str.values()), key=len, reverse=True)
    )
    + r")[0-9]+$"
)
_FLOAT_TEXT = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?|inf|nan)$")
_EXPR_NAMES = frozenset(
    [
        # torch.utils._sympy.functions, as GraphModuleDeserializer.sympy_functions lists them
        "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt",
        "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv",
        "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt",
        "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "Max", "Min", "int_oo",
        "IntInfinity", "NegativeIntInfinity",
        # sympy classes srepr writes
        "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Abs", "floor",
        "ceiling", "sqrt", "exp", "log", "sign", "Equality", "Unequality", "GreaterThan",
        "StrictGreaterThan", "LessThan", "StrictLessThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
        "And", "Or", "Not", "Xor", "Piecewise", "ExprCondPair", "ITE", "Tuple", "oo", "zoo",
        "nan", "true", "false", "True", "False", "pi", "E", "Infinity", "NegativeInfinity",
        "NaN", "ComplexInfinity", "Half", "One", "Zero", "NegativeOne",
        # keyword arguments
        "precision", "algebraic", "antihermitian", "commutative", "complex", "composite",
        "even", "extended_negative", "extended_nonnegative", "extended_nonpositive",
        "extended_nonzero", "extended_positive", "extended_real", "finite", "hermitian",
        "imaginary", "infinite", "integer", "irrational", "negative", "noninteger",
        "nonnegative", "nonpositive", "nonzero", "odd", "polar", "positive", "prime",
        "rational", "real", "transcendental", "zero",
    ]
)
_EXPR_GENERATED_NAMES = re.compile(r"^(?:OpaqueUnaryFn|BitwiseFn)_[a-z0-9_]+$")
_EXPR_OPERATORS = frozenset(
    ["+", "-", "*", "/", "//", "%", "**", "(", ")", ",", "<", ">", "<=", ">=", "==", "!=",
     "&", "|", "~", "="]
)
_STRING_LITERAL = re.compile(r"""^(['"])([^'"\\]*)\1$""")
_MAX_EXPR_CHARS = 100_000


def _check_expr(expr: str) -> None:
    """A symbolic expression must be sympy arithmetic over symbols: ``sympy.sympify`` evals it."""
    if len(expr) > _MAX_EXPR_CHARS or "\n" in expr or "\r" in expr:
        raise ProgramDecodeError(f"symbolic expression {expr[:200]!r} is refused")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(expr).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise ProgramDecodeError(f"symbolic expression {expr[:200]!r} is refused: {e}") from None
    before: list[str] = ["", ""]  # the two previous significant tokens
    for tok in tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            continue
        text = tok.string
        if tok.type == tokenize.NUMBER:
            ok = not re.search("[jJxXoObB_]", text)
        elif tok.type == tokenize.NAME:
            ok = text in _EXPR_NAMES or bool(
                _SYMBOL.match(text) or _EXPR_GENERATED_NAMES.match(text)
            )
        elif tok.type == tokenize.OP:
            ok = text in _EXPR_OPERATORS
        elif tok.type == tokenize.STRING:
            literal = _STRING_LITERAL.match(text)
            content = literal.group(2) if literal else ""
            ok = before[1] == "(" and (
                (before[0] == "Symbol" and bool(_SYMBOL.match(content)))
                or (before[0] == "Float" and bool(_FLOAT_TEXT.match(content)))
            )
        else:
            ok = False
        if not ok:
            raise ProgramDecodeError(
                f"symbolic expression {expr[:200]!r} is refused: {text[:50]!r} is not sympy "
                "arithmetic over symbols"
            )
        before = [before[1], text]


def _check_identifier(value: str, what: str) -> None:
    """A name FX writes into code. Empty is allowed (positional arguments of higher-order
    operators have no name) and is no code."""
    if value and not value.isidentifier():
        raise ProgramDecodeError(f"{what} {value[:200]!r} is not a Python identifier")


_FQN_PART = re.compile(r"""^[^"'\\]+$""")


def check_fqn(value: str, what: str) -> None:
    """An attribute path: FX writes its non-identifier parts into ``getattr(x, "...")``."""
    if value == "" and what == "fqn":
        return
    for part in value.split("."):
        if not part or not part.isprintable() or not _FQN_PART.match(part):
            raise ProgramDecodeError(f"{what} {value[:200]!r} is not an attribute path")


_DEFAULT_FACTORIES = frozenset(
    ["list", "dict", "set", "frozenset", "tuple", "int", "float", "bool", "str", "bytes"]
)


def _has_enum(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "__enum__" in v:
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _check_treespec(value: str, field: str) -> None:
    """A treespec (``in_spec``, ``out_spec``): torch's ``treespec_loads`` imports the modules
    it names (enum keys, ``defaultdict`` factories), so those are refused (but a builtin
    factory) before torch reads it. The keyword names of ``in_spec`` become code in
    ``module()``: they must not hold quotes or backslashes."""
    try:
        _protocol, root = json.loads(value)
    except (ValueError, TypeError):
        raise ProgramDecodeError(f"{field} is not a serialized treespec") from None
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or not isinstance(node.get("children_spec"), list):
            raise ProgramDecodeError(f"{field} is not a serialized treespec")
        context = node.get("context")
        if node.get("type") == "collections.defaultdict":
            if (
                not isinstance(context, dict)
                or context.get("default_factory_module") != "builtins"
                or context.get("default_factory_name") not in _DEFAULT_FACTORIES
            ):
                raise ProgramDecodeError(
                    f"{field}: a defaultdict whose factory is not a builtin type is refused "
                    "(torch would import its module)"
                )
        elif isinstance(context, str):
            try:
                context = json.loads(context)
            except ValueError:
                raise ProgramDecodeError(f"{field}: a treespec context is not JSON") from None
        if _has_enum(context):
            raise ProgramDecodeError(
                f"{field}: enum keys are refused (torch would import the module they name)"
            )
        stack.extend(node["children_spec"])
    if field != "in_spec":
        return
    try:
        spec = pytree.treespec_loads(value)
    except Exception as e:
        raise ProgramDecodeError(f"{field} cannot be read: {_short(e)}") from None
    specs = [spec]
    while specs:
        s = specs.pop()
        if s.type in (dict, OrderedDict, defaultdict):
            keys = s.context[1] if s.type is defaultdict else s.context
            for k in keys:
                if isinstance(k, str) and not (k.isprintable() and _FQN_PART.match(k)):
                    raise ProgramDecodeError(f"{field} key {k[:200]!r} is refused")
        specs.extend(s.children())


# guards_code: Python that ExportedProgram.module() execs (with builtins) when the program
# has example inputs. torch writes shape guards with ShapeGuardPythonPrinter, e.g.
# "L['x'].size()[0] == (1 + L['y'].size()[0])". Accepted: that language and no more.
_GUARD_NAMES = frozenset(
    ["L", "math", "max", "min", "abs", "int", "float", "True", "False", "None", "and", "or",
     "not", "if", "else", "inf"]
)
_GUARD_ATTRIBUTES = frozenset(
    ["size", "stride", "storage_offset", "floor", "ceil", "trunc", "sqrt", "exp", "log",
     "isnan", "isinf"]
)
_GUARD_OPERATORS = frozenset(
    ["+", "-", "*", "/", "//", "%", "(", ")", "[", "]", ",", "<", ">", "<=", ">=", "==", "!=",
     ".", "&", "|", "~"]
)
_KEY_TEXT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_guard(code: str) -> None:
    """A ``guards_code`` entry must be a shape guard: comparisons and arithmetic over input
    sizes, strides and offsets (``L['x'].size()[0]``). Anything else is refused."""
    def refuse(why: str) -> UnsafeGraphError:
        return UnsafeGraphError(
            f"guards_code entry {code[:200]!r} is Python that ExportedProgram.module() executes "
            f"and not a shape guard ({why}): refused"
        )

    if len(code) > _MAX_EXPR_CHARS or "\n" in code or "\r" in code:
        raise refuse("too long or several lines")
    try:
        tokens = [
            t for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)
        ]
    except (tokenize.TokenError, SyntaxError) as e:
        raise refuse(str(e)) from None
    for i, tok in enumerate(tokens):
        text = tok.string
        prev = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if tok.type == tokenize.NUMBER:
            ok = not re.search("[jJxXoObB_]", text)
        elif tok.type == tokenize.NAME:
            ok = text in _GUARD_ATTRIBUTES if prev == "." else text in _GUARD_NAMES
        elif tok.type == tokenize.OP:
            ok = text in _GUARD_OPERATORS
        elif tok.type == tokenize.STRING:
            literal = _STRING_LITERAL.match(text)
            ok = (
                prev == "[" and after == "]" and literal is not None
                and bool(_KEY_TEXT.match(literal.group(2)))
            )
        else:
            ok = False
        if not ok:
            raise refuse(f"{text[:50]!r}")


def field_rule(field: str, value: Any) -> None:
    """The checks of one schema field, by name (the export schema names fields consistently)."""
    if field in _IDENTIFIER_FIELDS and isinstance(value, str):
        _check_identifier(value, field)
    elif field in _FQN_FIELDS and isinstance(value, str):
        check_fqn(value, field)
    elif field == "expr_str":
        _check_expr(value)
    elif field == "as_operator":
        check_target(value)  # ProgramDecodeError, like a node target
    elif field == "forward_arg_names" and value is not None:
        for name in value:
            _check_identifier(name, "forward_arg_names entry")
    elif field in ("in_spec", "out_spec"):
        _check_treespec(value, field)
    elif field == "guards_code":
        for code in value:
            _check_guard(code)
    elif field in _GRAPH_NAME_MAPS:
        for key in value:
            _check_identifier(key, f"{field} key")


#: Fields whose value must be a string when present (a list would slip past the checks).
_STRING_FIELDS = frozenset(["expr_str", "as_operator", "in_spec", "out_spec"])


def check_fields(value: Any) -> None:
    """Apply :func:`field_rule` to every field of a parsed export-schema JSON document.

    Raises:
        ProgramDecodeError: a field that torch would turn into code or imports.
    """
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for key, item in v.items():
                if key in _STRING_FIELDS and item is not None and not isinstance(item, str):
                    raise ProgramDecodeError(f"field {key!r} is not a string")
                field_rule(key, item)
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)
