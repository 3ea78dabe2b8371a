"""Source-to-source forward-mode differentiation of a scalar Python function
(``@ng.elementwise``'s front end).

``derive(fn)`` reads ``fn``'s source (``inspect.getsource`` + ``ast``),
checks every construct against the supported subset, and writes two scalar
functions as source text:

* ``_value(v_x, v_y, ...)``: ``fn`` itself, every operation on its own line,
  each literal a number of the computing dtype (``_T(...)``), so a float32
  call computes in float32;
* ``_partials(v_x, v_y, ...)``: the tuple of the partial derivatives of
  ``fn`` by each argument, by forward-mode differentiation of the same
  statements: every value carries one tangent per argument, each statement
  gets its derivative by the chain rule (``_UNARY_RULES`` and
  ``_BINARY_RULES`` for the math functions),
  an ``if`` is differentiated branch by branch, and a comparison has zero
  derivative. A tangent known to be zero is left out of the expressions
  (not multiplied by 0, which is nan at inf), one known to be 1 is not
  multiplied by.

The device code around them (loops, broadcasting, ``_T``) is the caller's
(``numbagrad/elementwise_fn.py``); the helpers the generated code calls
(``HELPERS``) are source text too, compiled with it.
"""
from __future__ import annotations

import ast
import inspect
import math
import numbers
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Callable


class ElementwiseError(TypeError):
    """A function ``@ng.elementwise`` cannot compile: names the construct and line."""


ONE = "ONE"   # a tangent that is exactly 1 (an argument's own)

# math functions: name -> (number of arguments, derivative factors). Each
# factor is a format string of the arguments (a, b) and the value (y).
_UNARY_RULES = {
    "exp": "{y}", "expm1": "({y} + _T(1))", "log": "_T(1) / {a}",
    "log2": f"_T(1) / ({{a}} * _T({math.log(2.0)!r}))",
    "log10": f"_T(1) / ({{a}} * _T({math.log(10.0)!r}))",
    "log1p": "_T(1) / ({a} + _T(1))", "sqrt": "_T(0.5) / {y}",
    "sin": "math.cos({a})", "cos": "-math.sin({a})", "tan": "(_T(1) + {y} * {y})",
    "tanh": "(_T(1) - {y} * {y})", "sinh": "math.cosh({a})", "cosh": "math.sinh({a})",
    "asin": "_T(1) / math.sqrt(_T(1) - {a} * {a})",
    "acos": "-_T(1) / math.sqrt(_T(1) - {a} * {a})",
    "atan": "_T(1) / (_T(1) + {a} * {a})",
    "asinh": "_T(1) / math.sqrt({a} * {a} + _T(1))",
    "acosh": "_T(1) / math.sqrt({a} * {a} - _T(1))",
    "atanh": "_T(1) / (_T(1) - {a} * {a})",
    "erf": f"_T({2.0 / math.sqrt(math.pi)!r}) * math.exp(-{{a}} * {{a}})",
    "erfc": f"-_T({2.0 / math.sqrt(math.pi)!r}) * math.exp(-{{a}} * {{a}})",
    "fabs": "_sign({a})",
    "floor": None, "ceil": None, "trunc": None,     # zero derivative
}
_BINARY_RULES = {
    "atan2": ("{b} / ({a} * {a} + {b} * {b})", "-{a} / ({a} * {a} + {b} * {b})"),
    "hypot": ("{a} / {y}", "{b} / {y}"),
    "pow": None,        # as **
}
_MATH_CONSTANTS = {"pi", "e", "tau", "inf", "nan"}
_BUILTINS = {"min": min, "max": max, "abs": abs}
SUPPORTED_MATH = sorted(set(_UNARY_RULES) | set(_BINARY_RULES))

# Helpers the generated code calls: PyTorch's conventions (sign 0 at 0; max
# and min propagate nan and split the gradient at ties; pow's derivatives
# are 0 where PyTorch's are).
HELPERS = '''
def _sign(a):
    return _T(1) if a > _T(0) else (_T(-1) if a < _T(0) else _T(0))


def _max(a, b):
    return a if a > b or a != a else b


def _min(a, b):
    return a if a < b or a != a else b


def _dmax_a(a, b):
    return _T(0.5) if a == b else (_T(0) if a < b else _T(1))


def _dmax_b(a, b):
    return _T(0.5) if a == b else (_T(0) if a > b else _T(1))


def _dpow_a(a, b):
    if b == _T(0):
        return _T(0)
    return b * a ** (b - _T(1))


def _dpow_b(a, b, y):
    if a == _T(0) and b >= _T(0):
        return _T(0)
    return y * math.log(a)
'''


@dataclass
class Derived:
    """What ``derive`` found: the argument names and the two functions' source."""
    name: str
    args: tuple[str, ...]
    value_source: str
    partials_source: str


def _literal(v: Any) -> str:
    """A number as a literal of the computing dtype."""
    v = float(v)
    if math.isnan(v):
        return "_T(math.nan)"
    if math.isinf(v):
        return "_T(math.inf)" if v > 0 else "_T(-math.inf)"
    return f"_T({v!r})"


def _par(t: str) -> str:
    """A tangent as an operand: ONE as 1, a compound expression parenthesised."""
    if t == ONE:
        return "_T(1)"
    return t if t.isidentifier() else f"({t})"


def _fail(what: str, node: ast.AST | None, fn_name: str, first_line: int) -> ElementwiseError:
    line = f" (line {first_line + node.lineno - 1})" if node is not None and \
        hasattr(node, "lineno") else ""
    return ElementwiseError(f"ng.elementwise: {fn_name}: {what}{line}")


def _source_tree(fn: Callable) -> tuple[ast.AST, int]:
    """The FunctionDef or Lambda node of ``fn`` and the line its source starts on."""
    name = getattr(fn, "__name__", repr(fn))
    if not inspect.isfunction(fn):
        raise ElementwiseError(f"ng.elementwise: {name!r} is not a Python function")
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise ElementwiseError(f"ng.elementwise: the source of {name} cannot be read ({exc}); "
                               "define it with def in a file") from None
    text = textwrap.dedent("".join(lines))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    code = fn.__code__
    params = code.co_varnames[:code.co_argcount]
    if name == "<lambda>":
        found = [n for n in _lambdas(text, tree)
                 if tuple(a.arg for a in n.args.args) == params]
        if len(found) > 1:   # several on the line: one that compiles to fn's code
            found = [n for n in found if _same_code(n, code)][:1]
        if len(found) != 1:
            raise ElementwiseError(
                f"ng.elementwise: the source of a lambda (line {first}) cannot be read: no "
                f"lambda with arguments {params} found there; define it with def")
        return found[0], first
    found = [] if tree is None else [n for n in ast.walk(tree)
                                     if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        raise ElementwiseError(f"ng.elementwise: the source of {name} (line {first}) cannot "
                               "be parsed as a def")
    return found[0], first


def _lambdas(text: str, tree: ast.AST | None) -> list[ast.Lambda]:
    """The lambdas in ``text``, a lambda's source lines, which may be a piece
    of a longer expression that does not parse alone (``f(\\n lambda x: x)``):
    then each lambda is the longest text from its keyword on that parses."""
    if tree is not None:
        return [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    found = []
    for m in re.finditer(r"\blambda\b", text[:4000]):
        tail = text[m.start():m.start() + 2000]
        for end in range(len(tail), 0, -1):
            try:
                node = ast.parse(tail[:end], mode="eval").body
            except SyntaxError:
                continue
            if isinstance(node, ast.Lambda):
                ast.increment_lineno(node, text[:m.start()].count("\n"))
                found.append(node)
            break
    return found


def _same_code(node: ast.Lambda, code: Any) -> bool:
    """Whether the lambda ``node`` compiles to the bytecode and constants of ``code``."""
    try:
        outer = compile(ast.fix_missing_locations(ast.Expression(body=node)), "<lambda>", "eval")
    except (SyntaxError, ValueError, TypeError):
        return False
    inner = [c for c in outer.co_consts if hasattr(c, "co_code")]
    return len(inner) == 1 and inner[0].co_code == code.co_code \
        and inner[0].co_consts == code.co_consts and inner[0].co_names == code.co_names


def derive(fn: Callable) -> Derived:
    """``fn``'s value and partial-derivative functions as source (see the module
    docstring), or an ElementwiseError naming the first unsupported construct."""
    node, first = _source_tree(fn)
    name = "<lambda>" if isinstance(node, ast.Lambda) else node.name
    a = node.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.kw_defaults \
            or getattr(a, "posonlyargs", []):
        raise _fail("only plain positional arguments without defaults are supported", node,
                    name, first)
    args = tuple(x.arg for x in a.args)
    if not args:
        raise _fail("the function takes no arguments", node, name, first)
    body = [ast.Return(value=node.body, lineno=node.lineno, col_offset=0)] \
        if isinstance(node, ast.Lambda) else node.body
    free = _free_values(fn)
    value = _Writer(args, free, name, first, tangents=False).function("_value", body)
    partials = _Writer(args, free, name, first, tangents=True).function("_partials", body)
    return Derived(name, args, value, partials)


def _free_values(fn: Callable) -> dict[str, Any]:
    """The values of the names ``fn`` reads that are not its own locals."""
    cv = inspect.getclosurevars(fn)
    out: dict[str, Any] = {}
    out.update(cv.builtins)
    out.update(cv.globals)
    out.update(cv.nonlocals)
    # names only read through attributes (math.exp) are in globals too
    for name in fn.__code__.co_names:
        if name not in out and name in fn.__globals__:
            out[name] = fn.__globals__[name]
    return out


class _Writer:
    """Writes one generated function: the primal statements and, with
    ``tangents``, each value's tangents by every argument."""

    def __init__(self, args: tuple, free: dict, fn_name: str, first: int, tangents: bool):
        self.args, self.free, self.fn_name, self.first = args, free, fn_name, first
        self.tangents = tangents
        self.n = len(args)
        self.count = 0

    # ----------------------------------------------------------- plumbing
    def fail(self, what: str, node: ast.AST | None) -> ElementwiseError:
        return _fail(what, node, self.fn_name, self.first)

    def fresh(self, prefix: str = "_t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def function(self, name: str, body: list) -> str:
        env = {a: [ONE if i == j else None for i in range(self.n)] for j, a in
               enumerate(self.args)}
        lines: list[str] = []
        if self.block(body, env, lines, 1) is not None:
            raise self.fail("not every path ends in a return", body[-1] if body else None)
        params = ", ".join(f"v_{a}" for a in self.args)
        return f"def {name}({params}):\n" + "\n".join(lines) + "\n"

    @staticmethod
    def emit(lines: list, depth: int, text: str) -> None:
        lines.append("    " * depth + text)

    def tangent_text(self, t: str | None) -> str:
        return "_T(0)" if t is None else "_T(1)" if t == ONE else t

    def assign_tangents(self, lines: list, depth: int, ts: list) -> list:
        """Tangent expressions bound to fresh names (ONE and None stay as they are)."""
        out = []
        for t in ts:
            if t is None or t == ONE or t.isidentifier():
                out.append(t)
            else:
                v = self.fresh("_d")
                self.emit(lines, depth, f"{v} = _T({t})")
                out.append(v)
        return out

    # --------------------------------------------------------- statements
    def block(self, body: list, env: dict, lines: list, depth: int) -> dict | None:
        """Write ``body``; the environment after it, or None when every path returned."""
        for stmt in body:
            if env is None:
                raise self.fail("unreachable code after a return", stmt)
            env = self.statement(stmt, env, lines, depth)
        return env

    def statement(self, stmt: ast.stmt, env: dict, lines: list, depth: int) -> dict | None:
        if isinstance(stmt, ast.Return):
            if stmt.value is None:
                raise self.fail("a return without a value", stmt)
            atom, ts = self.expr(stmt.value, env, lines, depth)
            if self.tangents:
                parts = ", ".join(self.tangent_text(t) for t in ts)
                self.emit(lines, depth, f"return ({parts},)")
            else:
                self.emit(lines, depth, f"return _T({atom})")
            return None
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                raise self.fail("only assignments to one plain name are supported", stmt)
            return self.bind(stmt.targets[0].id, stmt.value, env, lines, depth)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            return self.bind(stmt.target.id, stmt.value, env, lines, depth)
        if isinstance(stmt, ast.AugAssign):
            if not isinstance(stmt.target, ast.Name):
                raise self.fail("only augmented assignments to a plain name are supported",
                                stmt)
            value = ast.BinOp(left=ast.Name(id=stmt.target.id, ctx=ast.Load()), op=stmt.op,
                              right=stmt.value, lineno=stmt.lineno, col_offset=0)
            return self.bind(stmt.target.id, value, env, lines, depth)
        if isinstance(stmt, ast.If):
            return self.branch(stmt, env, lines, depth)
        if isinstance(stmt, ast.Pass):
            return env
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and isinstance(stmt.value.value, str):
            return env     # a docstring
        kinds = {ast.For: "a for loop", ast.While: "a while loop", ast.With: "a with block",
                 ast.Try: "a try block", ast.FunctionDef: "a nested function",
                 ast.Lambda: "a lambda", ast.Import: "an import",
                 ast.ImportFrom: "an import", ast.Global: "a global statement",
                 ast.Nonlocal: "a nonlocal statement", ast.Raise: "a raise",
                 ast.Assert: "an assert", ast.Delete: "a del"}
        what = kinds.get(type(stmt), f"a {type(stmt).__name__} statement")
        raise self.fail(f"{what} is not supported (straight-line code with if/else only)",
                        stmt)

    def bind(self, name: str, value: ast.expr, env: dict, lines: list, depth: int) -> dict:
        atom, ts = self.expr(value, env, lines, depth)
        ts = self.assign_tangents(lines, depth, ts)
        self.emit(lines, depth, f"v_{name} = _T({atom})")
        env = dict(env)
        env[name] = ts
        return env

    def branch(self, stmt: ast.If, env: dict, lines: list, depth: int) -> dict | None:
        test = self.condition(stmt.test, env, lines, depth)
        self.emit(lines, depth, f"if {test}:")
        body_lines: list[str] = []
        else_lines: list[str] = []
        env_a = self.block(stmt.body, dict(env), body_lines, depth + 1)
        env_b = self.block(stmt.orelse, dict(env), else_lines, depth + 1)
        if env_a is None and env_b is None:
            merged = None
        elif env_a is None or env_b is None:
            merged = env_b if env_a is None else env_a
        else:   # names bound on both paths; a tangent that differs gets one name
            merged = {}
            for name in env_a.keys() & env_b.keys():
                ta, tb = env_a[name], env_b[name]
                out = []
                for x, y in zip(ta, tb):
                    if x == y:
                        out.append(x)
                        continue
                    v = self.fresh("_d")
                    self.emit(body_lines, depth + 1, f"{v} = {self.tangent_text(x)}")
                    self.emit(else_lines, depth + 1, f"{v} = {self.tangent_text(y)}")
                    out.append(v)
                merged[name] = out
        lines += body_lines or ["    " * (depth + 1) + "pass"]
        if else_lines:
            self.emit(lines, depth, "else:")
            lines += else_lines
        return merged

    # -------------------------------------------------------- expressions
    def condition(self, node: ast.expr, env: dict, lines: list, depth: int) -> str:
        """A test's source (primal only: a condition has no derivative); the
        values it compares are written to ``lines`` first."""
        if isinstance(node, ast.BoolOp):
            op = " and " if isinstance(node.op, ast.And) else " or "
            return "(" + op.join(self.condition(v, env, lines, depth)
                                 for v in node.values) + ")"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return f"(not {self.condition(node.operand, env, lines, depth)})"
        if isinstance(node, ast.Compare):
            parts = [self.pure(node.left, env, lines, depth)]
            for op, right in zip(node.ops, node.comparators):
                parts += [self.compare_op(op, node), self.pure(right, env, lines, depth)]
            return "(" + " ".join(parts) + ")"
        return f"({self.pure(node, env, lines, depth)} != _T(0))"

    def compare_op(self, op: ast.cmpop, node: ast.AST) -> str:
        ops = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
               ast.NotEq: "!="}
        if type(op) not in ops:
            raise self.fail(f"the comparison {type(op).__name__} is not supported", node)
        return ops[type(op)]

    def pure(self, node: ast.expr, env: dict, lines: list, depth: int) -> str:
        """A value with no tangents (compared in a condition)."""
        saved, self.tangents = self.tangents, False
        try:
            return self.expr(node, env, lines, depth)[0]
        finally:
            self.tangents = saved

    def expr(self, node: ast.expr, env: dict, lines: list, depth: int
             ) -> tuple[str, list]:
        """(source of the value: a name or a short expression, its tangents)."""
        zero = [None] * self.n
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                if isinstance(v, bool):
                    return _literal(v), zero
                raise self.fail(f"the constant {v!r} is not a real number", node)
            return _literal(v), zero
        if isinstance(node, ast.Name):
            if node.id in env:
                return f"v_{node.id}", list(env[node.id])
            return self.constant(node.id, node), zero
        if isinstance(node, ast.Attribute):
            return self.constant_attribute(node), zero
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.UAdd):
                return self.expr(node.operand, env, lines, depth)
            if isinstance(node.op, ast.USub):
                a, ta = self.expr(node.operand, env, lines, depth)
                return self.let(lines, depth, f"-{a}"), [self.neg(t) for t in ta]
            if isinstance(node.op, ast.Not):
                test = self.condition(node, env, lines, depth)
                return self.let(lines, depth, f"_T({test})"), zero
            raise self.fail(f"the operator {type(node.op).__name__} is not supported", node)
        if isinstance(node, ast.BinOp):
            return self.binop(node, env, lines, depth)
        if isinstance(node, ast.Compare):
            return self.let(lines, depth, f"_T({self.condition(node, env, lines, depth)})"), zero
        if isinstance(node, ast.IfExp):
            return self.ifexp(node, env, lines, depth)
        if isinstance(node, ast.Call):
            return self.call(node, env, lines, depth)
        if isinstance(node, ast.BoolOp):
            raise self.fail("and/or as a value is not supported (use it in an if test, or "
                            "write a conditional expression)", node)
        if isinstance(node, ast.Lambda):
            raise self.fail("a lambda inside the function is not supported", node)
        raise self.fail(f"the expression {type(node).__name__} is not supported", node)

    def let(self, lines: list, depth: int, text: str) -> str:
        v = self.fresh()
        self.emit(lines, depth, f"{v} = {text}")
        return v

    def constant(self, name: str, node: ast.AST) -> str:
        if name not in self.free:
            raise self.fail(f"the name {name!r} is not defined", node)
        v = self.free[name]
        if isinstance(v, numbers.Real) and not isinstance(v, bool) or isinstance(v, bool):
            return _literal(v)
        raise self.fail(f"the name {name!r} is a {type(v).__name__}, not a number (only "
                        "numbers can be read from outside the function)", node)

    def constant_attribute(self, node: ast.Attribute) -> str:
        if isinstance(node.value, ast.Name) and self.free.get(node.value.id) is math \
                and node.attr in _MATH_CONSTANTS:
            return _literal(getattr(math, node.attr))
        raise self.fail(f"the attribute {ast.unparse(node)!r} is not supported (math's "
                        f"constants are: {', '.join(sorted(_MATH_CONSTANTS))})", node)

    # tangent arithmetic: None is zero, ONE is one
    @staticmethod
    def neg(t: str | None) -> str | None:
        return None if t is None else "_T(-1)" if t == ONE else f"-{_par(t)}"

    @staticmethod
    def scale(factor: str, t: str | None) -> str | None:
        return None if t is None else factor if t == ONE else f"{factor} * {_par(t)}"

    @staticmethod
    def add(s: str | None, t: str | None) -> str | None:
        if s is None:
            return t
        if t is None:
            return s
        return f"{_par(s)} + {_par(t)}"

    def sub(self, s: str | None, t: str | None) -> str | None:
        if t is None:
            return s
        if s is None:
            return self.neg(t)
        return f"{_par(s)} - {_par(t)}"

    def binop(self, node: ast.BinOp, env: dict, lines: list, depth: int) -> tuple[str, list]:
        ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
        if type(node.op) not in ops:
            raise self.fail(f"the operator {type(node.op).__name__} is not supported "
                            "(+ - * / ** only)", node)
        a, ta = self.expr(node.left, env, lines, depth)
        b, tb = self.expr(node.right, env, lines, depth)
        y = self.let(lines, depth, f"{a} {ops[type(node.op)]} {b}")
        if not self.tangents:
            return y, [None] * self.n
        if isinstance(node.op, ast.Add):
            ts = [self.add(s, t) for s, t in zip(ta, tb)]
        elif isinstance(node.op, ast.Sub):
            ts = [self.sub(s, t) for s, t in zip(ta, tb)]
        elif isinstance(node.op, ast.Mult):
            ts = [self.add(self.scale(b, s), self.scale(a, t)) for s, t in zip(ta, tb)]
        elif isinstance(node.op, ast.Div):
            q = None
            ts = []
            for s, t in zip(ta, tb):
                u = None if s is None else f"{_par(s)} / {b}"
                if t is not None:
                    q = q or self.let(lines, depth, f"{y} / {b}")
                    u = self.sub(u, self.scale(q, t))
                ts.append(u)
        else:
            return y, self.pow_tangents(a, b, y, ta, tb, lines, depth)
        return y, self.assign_tangents(lines, depth, ts)

    def pow_tangents(self, a: str, b: str, y: str, ta: list, tb: list, lines: list,
                     depth: int) -> list:
        fa = self.let(lines, depth, f"_dpow_a({a}, {b})") if any(ta) else None
        fb = self.let(lines, depth, f"_dpow_b({a}, {b}, {y})") if any(tb) else None
        ts = [self.add(self.scale(fa, s) if s else None, self.scale(fb, t) if t else None)
              for s, t in zip(ta, tb)]
        return self.assign_tangents(lines, depth, ts)

    def ifexp(self, node: ast.IfExp, env: dict, lines: list, depth: int) -> tuple[str, list]:
        test = self.condition(node.test, env, lines, depth)
        v = self.fresh()
        sides = []
        for part in (node.body, node.orelse):
            sub: list[str] = []
            atom, ts = self.expr(part, env, sub, depth + 1)
            self.emit(sub, depth + 1, f"{v} = _T({atom})")
            sides.append((sub, ts))
        out = []
        for i in range(self.n):
            x, y = sides[0][1][i], sides[1][1][i]
            if x == y and (x is None or x == ONE):
                out.append(x)
                continue
            d = self.fresh("_d")
            self.emit(sides[0][0], depth + 1, f"{d} = _T({self.tangent_text(x)})")
            self.emit(sides[1][0], depth + 1, f"{d} = _T({self.tangent_text(y)})")
            out.append(d)
        self.emit(lines, depth, f"if {test}:")
        lines += sides[0][0]
        self.emit(lines, depth, "else:")
        lines += sides[1][0]
        return v, out

    def callee(self, node: ast.Call) -> str:
        """The supported function a call names: "math.exp", "min", ..."""
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                and self.free.get(f.value.id) is math:
            if f.attr in _UNARY_RULES or f.attr in _BINARY_RULES:
                return f"math.{f.attr}"
            raise self.fail(f"math.{f.attr} is not supported (supported: "
                            f"{', '.join(SUPPORTED_MATH)})", node)
        if isinstance(f, ast.Name):
            v = self.free.get(f.id)
            if f.id in _BUILTINS and v is _BUILTINS[f.id]:
                return f.id
            if v is not None and getattr(v, "__module__", None) == "math" \
                    and getattr(math, getattr(v, "__name__", ""), None) is v \
                    and (v.__name__ in _UNARY_RULES or v.__name__ in _BINARY_RULES):
                return f"math.{v.__name__}"
        raise self.fail(f"a call to {ast.unparse(f)!r} is not supported (math.* functions "
                        f"{', '.join(SUPPORTED_MATH)}, and min, max, abs)", node)

    def call(self, node: ast.Call, env: dict, lines: list, depth: int) -> tuple[str, list]:
        name = self.callee(node)
        if node.keywords:
            raise self.fail(f"keyword arguments to {name} are not supported", node)
        parts = [self.expr(a, env, lines, depth) for a in node.args]
        short = name.split(".")[-1]
        if name in ("min", "max"):
            if len(parts) < 2:
                raise self.fail(f"{name} takes two or more numbers", node)
            value, ts = parts[0]
            for b, tb in parts[1:]:
                value, ts = self.extremum(name, value, ts, b, tb, lines, depth)
            return value, ts
        if name == "abs":
            short = "fabs"
        arity = 1 if short in _UNARY_RULES else 2
        if len(parts) != arity:
            raise self.fail(f"{name} takes {arity} argument{'s' * (arity > 1)}", node)
        if short == "pow":
            (a, ta), (b, tb) = parts
            y = self.let(lines, depth, f"{a} ** {b}")
            if not self.tangents:
                return y, [None] * self.n
            return y, self.pow_tangents(a, b, y, ta, tb, lines, depth)
        call = "abs" if name == "abs" else name
        y = self.let(lines, depth, f"_T({call}({', '.join(p[0] for p in parts)}))")
        if not self.tangents:
            return y, [None] * self.n
        if arity == 1:
            (a, ta), = parts
            rule = _UNARY_RULES[short]
            if rule is None or not any(ta):
                return y, [None] * self.n
            f = self.let(lines, depth, rule.format(a=a, y=y))
            return y, self.assign_tangents(lines, depth, [self.scale(f, t) for t in ta])
        (a, ta), (b, tb) = parts
        rule_a, rule_b = _BINARY_RULES[short]
        fa = self.let(lines, depth, rule_a.format(a=a, b=b, y=y)) if any(ta) else None
        fb = self.let(lines, depth, rule_b.format(a=a, b=b, y=y)) if any(tb) else None
        ts = [self.add(self.scale(fa, s) if s else None, self.scale(fb, t) if t else None)
              for s, t in zip(ta, tb)]
        return y, self.assign_tangents(lines, depth, ts)

    def extremum(self, name: str, a: str, ta: list, b: str, tb: list, lines: list,
                 depth: int) -> tuple[str, list]:
        y = self.let(lines, depth, f"_{name}({a}, {b})")
        if not self.tangents or not (any(ta) or any(tb)):
            return y, [None] * self.n
        first, second = ("_dmax_a", "_dmax_b") if name == "max" else ("_dmax_b", "_dmax_a")
        fa = self.let(lines, depth, f"{first}({a}, {b})") if any(ta) else None
        fb = self.let(lines, depth, f"{second}({a}, {b})") if any(tb) else None
        ts = [self.add(self.scale(fa, s) if s else None, self.scale(fb, t) if t else None)
              for s, t in zip(ta, tb)]
        return y, self.assign_tangents(lines, depth, ts)
